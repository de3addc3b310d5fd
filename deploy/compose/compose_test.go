package compose_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/ratelimit-authz/ratelimit-authz/deploy/image"
	"github.com/ratelimit-authz/ratelimit-authz/deploy/internal/serverbin"
)

// serverBin is the server, built once for this test binary.
var serverBin string

func TestMain(m *testing.M) { serverbin.Main(m, &serverBin) }

// secretsEnv is what the top of docker-compose.yaml tells users to set.
var secretsEnv = []string{
	"POSTGRES_PASSWORD=pg-test",
	"NATS_NODE_PASSWORD=node-test",
	"NATS_APP_PASSWORD=app-test",
	"RATELIMIT_AUTHZ_CLUSTER_KEY=MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
}

func load(t *testing.T, env []string) (*types.Project, error) {
	t.Helper()
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yaml")},
		cli.WithWorkingDirectory(root),
		cli.WithEnv(env),
		cli.WithInterpolation(true),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return opts.LoadProject(ctx)
}

// TestComposeLoads: the compose specification's loader accepts the file
// (schema, interpolation, consistency of the references between services)
// and it holds what the issue asks for: Envoy, three nodes, three NATS
// servers, Postgres with the migration run once, and the example app.
func TestComposeLoads(t *testing.T) {
	p, err := load(t, secretsEnv)
	if err != nil {
		t.Fatalf("compose-go: %v", err)
	}
	for _, name := range []string{"envoy", "ratelimit-authz", "migrate", "postgres", "nats-0", "nats-1", "nats-2", "app"} {
		if _, err := p.GetService(name); err != nil {
			t.Errorf("service %s: %v", name, err)
		}
	}
	node, err := p.GetService("ratelimit-authz")
	if err != nil {
		t.Fatal(err)
	}
	if node.Deploy == nil || node.Deploy.Replicas == nil || *node.Deploy.Replicas != 3 {
		t.Errorf("ratelimit-authz: want deploy.replicas 3")
	}
	if d, ok := node.DependsOn["migrate"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
		t.Errorf("the nodes must wait for the migration to complete: %+v", node.DependsOn)
	}
	migrate, _ := p.GetService("migrate")
	if d, ok := migrate.DependsOn["postgres"]; !ok || d.Condition != types.ServiceConditionHealthy {
		t.Errorf("the migration must wait for a healthy Postgres: %+v", migrate.DependsOn)
	}
	if migrate.Restart != "no" {
		t.Errorf("migrate restart %q: it runs once", migrate.Restart)
	}
	pg, _ := p.GetService("postgres")
	if pg.HealthCheck == nil || len(pg.HealthCheck.Test) == 0 {
		t.Error("postgres: no healthcheck")
	}
	// Every file a service mounts exists.
	for _, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type != types.VolumeTypeBind {
				continue
			}
			if _, err := os.Stat(v.Source); err != nil {
				t.Errorf("service %s mounts %s: %v", s.Name, v.Source, err)
			}
		}
	}
	// Images built here name the Dockerfile's stages.
	root, _ := serverbin.RepoRoot(".")
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Services {
		if s.Build != nil && !strings.Contains(string(dockerfile), " AS "+s.Build.Target+"\n") {
			t.Errorf("service %s builds target %q, which the Dockerfile lacks", s.Name, s.Build.Target)
		}
	}
}

// TestComposeNeedsSecrets: without the secrets in the environment the
// loader stops with a message that names the missing variable, instead of
// starting a cluster with empty passwords or no cluster key.
func TestComposeNeedsSecrets(t *testing.T) {
	for i, kv := range secretsEnv {
		name, _, _ := strings.Cut(kv, "=")
		env := slices.Delete(slices.Clone(secretsEnv), i, i+1)
		_, err := load(t, env)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("loading without %s: %v, want an error naming it", name, err)
		}
	}
}

// TestComposeMatchesBinary: every variable, flag and port the ratelimit-authz
// services use exists in the binary (from its own --help), and secrets are
// never flags.
func TestComposeMatchesBinary(t *testing.T) {
	p, err := load(t, secretsEnv)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	checked := 0
	for _, s := range p.Services {
		if !strings.HasPrefix(s.Image, "ratelimit-authz:") {
			continue
		}
		checked++
		sub := "serve"
		args := []string(s.Command)
		if len(s.Entrypoint) > 0 {
			if s.Entrypoint[0] != "/ratelimit-authz" || len(s.Entrypoint) < 2 {
				t.Errorf("%s: entrypoint %q", s.Name, s.Entrypoint)
				continue
			}
			sub = s.Entrypoint[1]
		}
		surface, err := serverbin.Help(ctx, serverBin, sub)
		if err != nil {
			t.Fatal(err)
		}
		settings := map[string]string{}
		for _, f := range surface.Flags {
			settings[f.Name] = f.Default
		}
		for i := 0; i < len(args); i++ {
			name, val, has := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
			if _, ok := surface.Flags[name]; !ok || !strings.HasPrefix(args[i], "-") {
				t.Errorf("%s: ratelimit-authz %s has no flag %q", s.Name, sub, args[i])
				continue
			}
			if !has && i+1 < len(args) {
				i++
				val = args[i]
			}
			if strings.Contains(name, "password") || strings.Contains(name, "key") && !strings.HasSuffix(name, "-file") || name == "database-url" {
				t.Errorf("%s: secret flag --%s: use the environment or a file", s.Name, name)
			}
			settings[name] = val
		}
		for name, val := range s.Environment {
			if !surface.Env[name] {
				t.Errorf("%s: ratelimit-authz %s reads no variable %s", s.Name, sub, name)
				continue
			}
			if f, ok := surface.EnvFlag(name); ok && val != nil {
				settings[f.Name] = *val
			}
		}
		if sub != "serve" {
			continue
		}
		// The image listens where its environment says; the service's
		// ports must be those.
		for _, e := range image.Env() {
			name, val, _ := strings.Cut(e, "=")
			if f, ok := surface.EnvFlag(name); ok {
				if _, set := s.Environment[name]; !set {
					settings[f.Name] = val
				}
			}
		}
		listen := map[string]bool{}
		for _, f := range []string{"grpc-addr", "check-addr", "http-addr"} {
			a := settings[f]
			if a == "" {
				t.Errorf("%s: --%s is not set", s.Name, f)
				continue
			}
			listen[a[strings.LastIndex(a, ":")+1:]] = true
		}
		checkProbe(t, ctx, s, settings["http-addr"])
		for _, e := range s.Expose {
			if !listen[e] {
				t.Errorf("%s: exposes %s, the node listens on %v", s.Name, e, listen)
			}
		}
		for _, pc := range s.Ports {
			if !listen[fmt.Sprint(pc.Target)] {
				t.Errorf("%s: publishes %d, the node listens on %v", s.Name, pc.Target, listen)
			}
			if pc.HostIP != "127.0.0.1" {
				t.Errorf("%s: publishes %d on %q: the admin port stays on loopback", s.Name, pc.Target, pc.HostIP)
			}
		}
		if s.StopGracePeriod == nil {
			t.Errorf("%s: no stop_grace_period", s.Name)
		} else {
			drain, err := time.ParseDuration(settings["drain-delay"])
			if err != nil {
				t.Errorf("%s: drain delay: %v", s.Name, err)
			}
			stop, err := time.ParseDuration(settings["shutdown-timeout"])
			if err != nil {
				t.Errorf("%s: shutdown timeout: %v", s.Name, err)
			}
			if time.Duration(*s.StopGracePeriod) <= drain+stop {
				t.Errorf("%s: stop_grace_period %v is not above drain %v + shutdown %v", s.Name, time.Duration(*s.StopGracePeriod), drain, stop)
			}
		}
		if !s.ReadOnly || !slices.Contains(s.CapDrop, "ALL") {
			t.Errorf("%s: want read_only and cap_drop ALL", s.Name)
		}
	}
	if checked != 2 {
		t.Errorf("%d services run the ratelimit-authz image: want the nodes and the migration", checked)
	}
}

// checkProbe: a node's healthcheck runs the binary's own probe (the image
// has no shell) with flags `probe --help` lists, on the node's HTTP port
// over loopback, and the probe gives up before compose's timeout does.
func checkProbe(t *testing.T, ctx context.Context, s types.ServiceConfig, httpAddr string) {
	t.Helper()
	hc := s.HealthCheck
	if hc == nil || len(hc.Test) < 3 || hc.Test[0] != "CMD" || hc.Test[1] != "/ratelimit-authz" || hc.Test[2] != "probe" {
		t.Errorf("%s: healthcheck %v, want [CMD /ratelimit-authz probe …]", s.Name, hc)
		return
	}
	surface, err := serverbin.Help(ctx, serverBin, "probe")
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, f := range surface.Flags {
		settings[f.Name] = strings.Trim(f.Default, `"`)
	}
	args := hc.Test[3:]
	for i := 0; i < len(args); i++ {
		name, val, has := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if _, ok := surface.Flags[name]; !ok || !strings.HasPrefix(args[i], "-") {
			t.Errorf("%s: ratelimit-authz probe has no flag %q", s.Name, args[i])
			continue
		}
		if !has && i+1 < len(args) {
			i++
			val = args[i]
		}
		settings[name] = val
	}
	u, err := url.Parse(settings["url"])
	if err != nil {
		t.Fatalf("%s: probe URL: %v", s.Name, err)
	}
	_, port, err := net.SplitHostPort(httpAddr)
	if err != nil {
		t.Fatalf("%s: HTTP address %q: %v", s.Name, httpAddr, err)
	}
	if u.Hostname() != "127.0.0.1" || u.Port() != port || u.Path != "/readyz" {
		t.Errorf("%s: probe URL %s, want http://127.0.0.1:%s/readyz (the node's HTTP address)", s.Name, u, port)
	}
	probeTimeout, err := time.ParseDuration(settings["timeout"])
	if err != nil || hc.Timeout == nil || probeTimeout >= time.Duration(*hc.Timeout) {
		t.Errorf("%s: probe timeout %q must be below the healthcheck's timeout %v", s.Name, settings["timeout"], hc.Timeout)
	}
}
