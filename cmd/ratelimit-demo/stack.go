package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/exampleapp"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/proc"
)

const (
	serverConfig   = "config/ratelimit.yaml"
	installTimeout = 5 * time.Minute // a cold Envoy install or go build
	readyTimeout   = 30 * time.Second
	stopGrace      = 10 * time.Second // SIGTERM → SIGKILL
	warmUpTimeout  = 5 * time.Second
)

// demo is one run: its log folder, the processes, the application and the
// client that sends the bursts.
type demo struct {
	o      options
	env    []string
	out    *printer
	root   string // the repository, or "" when run outside it with every path given
	logDir string

	app      *exampleapp.App
	appSrv   *http.Server
	appAddr  string
	addrs    envoyconf.Addrs
	httpAddr string // the server's /readyz and /metrics
	// adminAddr is the server's admin listener: the live view of who is
	// limited, which the demo reads at its end.
	adminAddr string
	server    *proc.Process
	envoy     *proc.Process
	client    *http.Client

	results []*row
}

// newDemo resolves the paths the run needs and creates its log folder.
func newDemo(o options, env []string, out *printer) (*demo, error) {
	d := &demo{o: o, env: env, out: out}
	root, rootErr := binaries.ModuleRoot(".")
	if rootErr == nil {
		d.root = root
	}
	fromRoot := func(p *string, rel, flag string) error {
		if *p == "" {
			if rootErr != nil {
				return fmt.Errorf("%w; run from inside the repository or give %s", rootErr, flag)
			}
			*p = filepath.Join(root, rel)
		}
		if _, err := os.Stat(*p); err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		}
		return nil
	}
	if err := fromRoot(&d.o.config, serverConfig, "--config"); err != nil {
		return nil, err
	}
	if err := fromRoot(&d.o.envoyConfig, envoyconf.Path, "--envoy-config"); err != nil {
		return nil, err
	}
	for _, b := range []struct{ path, flag string }{{o.serverBin, "--server-bin"}, {o.envoyBin, "--envoy"}} {
		if b.path == "" && rootErr != nil {
			return nil, fmt.Errorf("%w; run from inside the repository or give %s", rootErr, b.flag)
		}
		if b.path != "" {
			if err := binaries.Executable(b.path); err != nil {
				return nil, fmt.Errorf("%s: %w", b.flag, err)
			}
		}
	}
	dir, err := os.MkdirTemp(o.logDir, "ratelimit-demo-")
	if err != nil {
		return nil, fmt.Errorf("log folder: %w", err)
	}
	d.logDir = dir
	return d, nil
}

// run starts everything, fires the bursts and prints the report. The
// caller stops what was started (d.stop) whatever run returns.
func (d *demo) run(ctx context.Context) error {
	d.out.linef("ratelimit-demo: process logs in %s", d.logDir)
	envoyBin, serverBin, err := d.binaries(ctx)
	if err != nil {
		return err
	}
	if err := d.start(ctx, envoyBin, serverBin); err != nil {
		return err
	}
	return d.fire(ctx)
}

// binaries returns the envoy and ratelimit-authz to run, installing or
// building them when no flag named them.
func (d *demo) binaries(ctx context.Context) (envoyBin, serverBin string, err error) {
	envoyBin, serverBin = d.o.envoyBin, d.o.serverBin
	if envoyBin == "" {
		d.out.linef("  envoy            the pinned version (%s installs it when missing)", binaries.EnvoyScript)
		ictx, cancel := context.WithTimeout(ctx, installTimeout)
		envoyBin, err = binaries.Envoy(ictx, d.root)
		cancel()
		if err != nil {
			return "", "", err
		}
	}
	if serverBin == "" {
		d.out.linef("  ratelimit-authz  go build %s", binaries.ServerPackage)
		serverBin = filepath.Join(d.logDir, "ratelimit-authz")
		bctx, cancel := context.WithTimeout(ctx, installTimeout)
		err = binaries.BuildServer(bctx, d.root, serverBin)
		cancel()
		if err != nil {
			return "", "", err
		}
	}
	return envoyBin, serverBin, nil
}

// start starts the application, the server and Envoy, in that order, each
// ready before the next, and checks that a request passes through.
func (d *demo) start(ctx context.Context, envoyBin, serverBin string) error {
	if err := d.startApp(); err != nil {
		return err
	}
	var err error
	if d.httpAddr, err = freeport.Addr(); err != nil {
		return err
	}
	if d.adminAddr, err = freeport.Addr(); err != nil {
		return err
	}
	// Envoy's ext_authz filter calls the lean Check listener, its access
	// log the gRPC port, as in the shipped bootstrap.
	d.addrs = envoyconf.Addrs{App: d.appAddr, Authz: make([]string, 1), Check: make([]string, 1)}
	for _, p := range []*string{&d.addrs.Admin, &d.addrs.Listener, &d.addrs.Authz[0], &d.addrs.Check[0]} {
		if *p, err = freeport.Addr(); err != nil {
			return err
		}
	}
	// The processes outlive ctx on purpose: Ctrl-C cancels ctx, and then
	// d.stop stops them by PID in order. Their lifetime is the last resort.
	life := context.WithoutCancel(ctx)
	lifetime := d.o.timeout + 30*time.Second
	if d.o.stay {
		lifetime = 24 * time.Hour // until Ctrl-C; still a bound
	}

	d.server, err = proc.Start(life, proc.Config{
		Name: "ratelimit-authz", Path: serverBin, Env: childEnv(d.env), LogDir: d.logDir,
		Lifetime: lifetime, StopGrace: stopGrace,
		Args: []string{"serve",
			"--config", d.o.config,
			"--grpc-addr", d.addrs.Authz[0],
			"--check-addr", d.addrs.Check[0],
			"--http-addr", d.httpAddr,
			"--admin-addr", d.adminAddr,
			"--drain-delay", "0s", // nothing to drain for: Envoy is stopped first
			"--shutdown-timeout", "5s",
		},
	})
	if err != nil {
		return err
	}
	if err := d.ready(ctx, d.server, "http://"+d.httpAddr+"/readyz"); err != nil {
		return err
	}
	d.out.linef("  ratelimit-authz  pid %-7d gRPC %s, Check %s, metrics http://%s/metrics, live view http://%s/", d.server.PID(), d.addrs.Authz[0], d.addrs.Check[0], d.httpAddr, d.adminAddr)

	envoyCfg := filepath.Join(d.logDir, "envoy.yaml")
	if err := envoyconf.RenderFile(d.o.envoyConfig, envoyCfg, d.addrs); err != nil {
		return err
	}
	d.envoy, err = proc.Start(life, proc.Config{
		Name: "envoy", Path: envoyBin, Env: d.env, LogDir: d.logDir,
		Lifetime: lifetime, StopGrace: stopGrace,
		Args: []string{"-c", envoyCfg, "--concurrency", "2", "--disable-hot-restart", "--log-level", "warn"},
	})
	if err != nil {
		return err
	}
	if err := d.ready(ctx, d.envoy, "http://"+d.addrs.Admin+"/ready"); err != nil {
		return err
	}
	d.out.linef("  envoy            pid %-7d listener http://%s, admin http://%s", d.envoy.PID(), d.addrs.Listener, d.addrs.Admin)
	d.out.linef("  app              in-process     http://%s (logins accept the password %q)", d.appAddr, exampleapp.Password)

	d.client = &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: workers, IdleConnTimeout: 30 * time.Second},
	}
	return d.warmUp(ctx)
}

func (d *demo) ready(ctx context.Context, p *proc.Process, url string) error {
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := p.WaitHTTP200(rctx, url); err != nil {
		return fmt.Errorf("%s did not become ready: %w\n--- tail of %s ---\n%s", p.Name(), err, p.LogPath(), p.Tail(20))
	}
	return nil
}

// startApp serves the example application on a free loopback port.
func (d *demo) startApp() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("app: %w", err)
	}
	d.app = exampleapp.New()
	d.appAddr = l.Addr().String()
	d.appSrv = &http.Server{Handler: d.app, ReadHeaderTimeout: 5 * time.Second}
	go d.appSrv.Serve(l) // ends with Shutdown in d.stop
	return nil
}

// warmUp sends one request through Envoy, so that the gRPC connection to
// the server exists before the first burst, and so that a stack that does
// not work fails here with a clear message.
func (d *demo) warmUp(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
	defer cancel()
	req := request{path: "/api/activities", header: map[string]string{"x-tenant-id": "warm-up"}}
	var last result
	for {
		last = d.do(wctx, req)
		if last.err == nil && last.status == http.StatusOK {
			return nil
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			what := fmt.Sprintf("status %d %s", last.status, strings.TrimSpace(string(last.body)))
			if last.err != nil {
				what = last.err.Error()
			}
			hint := ""
			if last.status == http.StatusServiceUnavailable {
				hint = " (503 is Envoy's status_on_error: it cannot reach ratelimit-authz)"
			}
			return fmt.Errorf("a request through Envoy did not pass within %v: %s%s", warmUpTimeout, what, hint)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop stops Envoy, then the server (both by PID: SIGTERM, SIGKILL after
// stopGrace), then the application. It reports processes that did not
// stop cleanly.
func (d *demo) stop() error {
	var errs []error
	var stopped []string
	for _, p := range []*proc.Process{d.envoy, d.server} {
		if p == nil {
			continue
		}
		if err := p.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("%w\n--- tail of %s ---\n%s", err, p.LogPath(), p.Tail(10)))
			continue
		}
		stopped = append(stopped, fmt.Sprintf("%s (pid %d)", p.Name(), p.PID()))
	}
	if d.client != nil {
		d.client.CloseIdleConnections()
	}
	if d.appSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := d.appSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("app: %w", err))
		} else {
			stopped = append(stopped, "the app")
		}
		cancel()
	}
	if len(stopped) > 0 {
		d.out.linef("")
		d.out.linef("stopped %s", strings.Join(stopped, ", "))
	}
	return errors.Join(errs...)
}

// finishLogs removes the log folder after a successful run (unless
// --keep-logs); after a failure it keeps it and adds its path to err.
func (d *demo) finishLogs(err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("%w\nprocess logs kept in %s", err, d.logDir)
	case d.o.keepLogs:
		d.out.linef("process logs kept in %s (--keep-logs)", d.logDir)
	default:
		os.RemoveAll(d.logDir)
	}
	return nil
}
