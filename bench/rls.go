package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// The floor's ShouldRateLimit part: the same pinning, load tool and
// accounting as the Check targets, at saturation, with one descriptor per
// call ((remote_address, <client IP>): Envoy's commonest rate_limits
// entry) over the load tool's descriptor file (`ratelimit-bench rls-config`):
//
//   - rls-default-noop: `ratelimit-bench noop-grpc`, which answers
//     ShouldRateLimit OK on a default grpc.NewServer();
//   - rls-allowed, rls-denied: this tree's server on its gRPC port;
//     rls-lean-allowed, rls-lean-denied: on its lean listener;
//   - the anchors (below): envoyproxy/ratelimit with Redis
//     (ratelimit-redis-…), with its local cache (ratelimit-localcache-
//     denied) and gubernator (gubernator-…), each with the same keys and
//     limits.
const (
	floorRLS        = "rls-"
	floorRatelimit  = "ratelimit-redis-"
	floorRLCache    = "ratelimit-localcache-"
	floorGubernator = "gubernator-"
)

// isRLSTarget: the floor target is a ShouldRateLimit (or gubernator)
// one.
func isRLSTarget(name string) bool {
	return strings.HasPrefix(name, floorRLS) || strings.HasPrefix(name, floorRatelimit) ||
		strings.HasPrefix(name, floorRLCache) || strings.HasPrefix(name, floorGubernator)
}

// rlsFloorDescriptors are the descriptors per call of the floor's
// ShouldRateLimit loads.
const rlsFloorDescriptors = "1"

// rlsFloorTargets starts the ShouldRateLimit targets bound to cpu: this
// tree's and the anchors that built.
func (r *runner) rlsFloorTargets(ctx context.Context, cpu int) (targets []*server, err error) {
	defer func() {
		if err != nil {
			stopAll(targets)
			targets = nil
		}
	}()
	envs := map[bool][]string{} // RUNTIME_*: this server reads upstream's environment too
	for _, denied := range []bool{false, true} {
		name, perUnit := "floor-rls-allowed", uint32(2_000_000_000)
		if denied {
			name, perUnit = "floor-rls-denied", 1
		}
		if envs[denied], err = r.rlsRuntime(ctx, name, perUnit, "second"); err != nil {
			return nil, err
		}
	}
	outcome := map[bool]string{false: "allowed", true: "denied"}
	add := func(name, mode string, denied bool, start func() (*server, error)) error {
		t, err := start()
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		t.name, t.mode, t.w = name, mode, allowedLoad
		if denied {
			t.w = deniedLoad
		}
		targets = append(targets, t)
		return nil
	}
	serve := func(name string, env []string, lean bool, head ...string) func() (*server, error) {
		return func() (*server, error) {
			return r.startServer(ctx, cpu, "floor-"+name, env, lean, head[0], head[1:]...)
		}
	}
	name := floorRLS + floorDefaultNoop
	if err := add(name, "rls", false, serve(name, nil, false, r.bins.bench, "noop-grpc", "--lifetime", r.lifetime().String())); err != nil {
		return targets, err
	}
	for _, path := range []string{"", floorLean} {
		for _, denied := range []bool{false, true} {
			name := floorRLS + path + outcome[denied]
			head := append([]string{r.bins.server}, r.serve(r.allowedCfg)...)
			if err := add(name, "rls", denied, serve(name, envs[denied], path != "", head...)); err != nil {
				return targets, err
			}
		}
	}
	b := r.buildAnchors(ctx)
	if b.ratelimit != "" {
		for _, x := range []struct {
			name          string
			denied, cache bool
		}{{floorRatelimit + "allowed", false, false}, {floorRatelimit + "denied", true, false}, {floorRLCache + "denied", true, true}} {
			if err := add(x.name, "rls", x.denied, func() (*server, error) {
				return r.startRatelimit(ctx, cpu, "floor-"+x.name, b, envs[x.denied], x.cache)
			}); err != nil {
				return targets, err
			}
		}
	}
	if b.gubernator != "" {
		for _, denied := range []bool{false, true} {
			name := floorGubernator + outcome[denied]
			if err := add(name, "gubernator", denied, func() (*server, error) {
				return r.startGubernator(ctx, cpu, "floor-"+name, b)
			}); err != nil {
				return targets, err
			}
		}
	}
	return targets, nil
}

// loadArgs are the load tool's arguments for one run against t: check
// (the Check load of checkArgs), or the same with the rls load (one
// descriptor) or gubernator's, whose limit is in the request.
func (t *server) loadArgs(check []string) []string {
	switch t.mode {
	case "accesslog":
		return append([]string{"accesslog"}, check[1:]...)
	case "rls":
		return append([]string{"rls", "--descriptors", rlsFloorDescriptors}, check[1:]...)
	case "gubernator":
		limit := "2000000000"
		if t.w.name == deniedLoad.name {
			limit = "1"
		}
		return append([]string{"gubernator", "--descriptors", rlsFloorDescriptors, "--limit", limit, "--per", "1s"}, check[1:]...)
	}
	return check
}

// rlsFloorRatios are the ShouldRateLimit pairs the floor reports: this
// tree's server on each port against the default no-op and the anchors.
func rlsFloorRatios() map[string][]string {
	out := map[string][]string{}
	for _, path := range []string{"", floorLean} {
		out[floorRLS+path+"allowed"] = []string{floorRLS + floorDefaultNoop, floorRatelimit + "allowed", floorGubernator + "allowed"}
		out[floorRLS+path+"denied"] = []string{floorRLS + floorDefaultNoop, floorRatelimit + "denied", floorRLCache + "denied", floorGubernator + "denied"}
	}
	out[floorRLS+floorLean+"allowed"] = append(out[floorRLS+floorLean+"allowed"], floorRLS+"allowed")
	out[floorRLS+floorLean+"denied"] = append(out[floorRLS+floorLean+"denied"], floorRLS+"denied")
	return out
}

// The ShouldRateLimit floor targets: the lean listener's CPU per call at
// saturation against the default grpc-go no-op and envoyproxy/ratelimit.
const (
	targetRLSFloorNoop       = 0.35 // × the default no-op, allowed and denied
	targetRLSFloorRedis      = 0.15 // × envoyproxy/ratelimit with Redis, allowed and denied
	targetRLSFloorLocalCache = 0.3  // × envoyproxy/ratelimit's local-cache denials
)

// rlsRuntime writes a runtime directory (RUNTIME_ROOT/ratelimit/config)
// with the load tool's descriptor file at perUnit per unit, and returns
// the environment that points a server at it.
func (r *runner) rlsRuntime(ctx context.Context, name string, perUnit uint32, unit string) ([]string, error) {
	root := filepath.Join(r.tmp, name)
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The load tool writes the file its descriptors match.
	cfg, err := r.runTool(ctx, "rls-config-"+name, time.Minute, nil, "", r.bins.bench, "rls-config",
		"--limit", strconv.FormatUint(uint64(perUnit), 10), "--unit", unit)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), cfg, 0o644); err != nil {
		return nil, err
	}
	return []string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit"}, nil
}

// The anchors are the rate limiters users compare this server with, built
// at pinned versions from the Go module proxy and measured in the floor
// beside it, by the same load tool under the same pinning:
//
//   - envoyproxy/ratelimit, on the rls load's descriptor file, with a
//     throwaway Redis (Debian's redis-server, bound to the servers' CPU;
//     its CPU counts with the service's), and again with its local cache
//     of over-limit keys (LOCAL_CACHE_SIZE_IN_BYTES), which answers
//     denials without Redis;
//   - gubernator, one node, driven with GetRateLimits carrying the same
//     keys and limits (`ratelimit-bench gubernator`).
const (
	ratelimitPkg     = "github.com/envoyproxy/ratelimit/src/service_cmd"
	ratelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"
	gubernatorPkg    = "github.com/gubernator-io/gubernator/v2/cmd/gubernator"
	gubernatorVer    = "v2.21.0"
	// gubernator v2.21.0 needs a newer Go than the server's; the go
	// command fetches this toolchain from the module proxy for its build
	// only.
	gubernatorToolchain = "go1.27.3"
	// ratelimitLocalCache is envoyproxy/ratelimit's local cache of
	// over-limit keys in its local-cache run.
	ratelimitLocalCache = 64 << 20
)

// anchorBins are the anchors' binaries; an empty path: not built (the
// reason is in the report's notes).
type anchorBins struct{ ratelimit, gubernator, redis string }

// buildAnchors installs the anchors into the runner's directory. One that
// does not build is left out with a note; the floor runs without it.
func (r *runner) buildAnchors(ctx context.Context) anchorBins {
	var b anchorBins
	dir := filepath.Join(r.tmp, "anchors")
	install := func(name, pkg, version string, env ...string) string {
		start := time.Now()
		env = append([]string{"GOBIN=" + dir, "CGO_ENABLED=0"}, env...)
		if _, err := r.runTool(ctx, "install-"+filepath.Base(pkg), 10*time.Minute, env, r.tmp, "go", "install", pkg+"@"+version); err != nil {
			r.note("floor: %s not measured: go install %s@%s: %v", name, pkg, version, firstLine(err.Error()))
			return ""
		}
		r.printf("anchor: %s %s built in %.0fs\n", name, version, time.Since(start).Seconds())
		return filepath.Join(dir, filepath.Base(pkg))
	}
	b.ratelimit = install("envoyproxy/ratelimit", ratelimitPkg, ratelimitVersion)
	b.gubernator = install("gubernator", gubernatorPkg, gubernatorVer, "GOTOOLCHAIN="+gubernatorToolchain)
	if b.ratelimit != "" {
		out, err := r.runTool(ctx, "install-redis", 5*time.Minute, nil, r.root, "bash", filepath.Join(r.root, "scripts", "install-redis.sh"))
		if err != nil {
			r.note("floor: envoyproxy/ratelimit not measured: no redis-server: %v", firstLine(err.Error()))
			b.ratelimit = ""
		}
		b.redis = lastLine(out)
	}
	return b
}

// startRatelimit starts envoyproxy/ratelimit on the descriptor runtime
// env (rlsRuntime) with a Redis of its own, both bound to cpu; localCache
// turns its cache of over-limit keys on. The target's CPU is the two
// processes'.
func (r *runner) startRatelimit(ctx context.Context, cpu int, name string, b anchorBins, runtimeEnv []string, localCache bool) (*server, error) {
	addrs, err := freeport.Addrs(4)
	if err != nil {
		return nil, err
	}
	redisHost, redisPort := splitAddr(addrs[3])
	bin, args := onCPU(cpu, b.redis, "--bind", redisHost, "--port", redisPort, "--save", "", "--appendonly", "no", "--protected-mode", "yes")
	redis, err := r.start(name+"-redis", r.lifetime(), nil, bin, args...)
	if err != nil {
		return nil, err
	}
	// The service dials Redis once at start and exits if it cannot.
	if err := poll.Wait(10*time.Second, 20*time.Millisecond, func() error {
		if redis.Exited() {
			return fmt.Errorf("redis-server exited:\n%s", redis.Tail(10))
		}
		c, err := net.DialTimeout("tcp", addrs[3], time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		redis.stop()
		return nil, err
	}
	grpcHost, grpcPort := splitAddr(addrs[0])
	httpHost, httpPort := splitAddr(addrs[1])
	debugHost, debugPort := splitAddr(addrs[2])
	cache := "0"
	if localCache {
		cache = fmt.Sprint(ratelimitLocalCache)
	}
	env := append([]string{
		"RUNTIME_WATCH_ROOT=false", "USE_STATSD=false", "LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + addrs[3],
		"GRPC_HOST=" + grpcHost, "GRPC_PORT=" + grpcPort, "HOST=" + httpHost, "PORT=" + httpPort,
		"DEBUG_HOST=" + debugHost, "DEBUG_PORT=" + debugPort, "LOCAL_CACHE_SIZE_IN_BYTES=" + cache,
	}, runtimeEnv...)
	bin, args = onCPU(cpu, b.ratelimit)
	s := &server{name: name, grpc: addrs[0], addr: addrs[0], http: addrs[1], also: []*proc{redis}}
	if s.proc, err = r.start(name, r.lifetime(), env, bin, args...); err != nil {
		redis.stop()
		return nil, err
	}
	if err := waitHTTP200(ctx, s.proc, "http://"+addrs[1]+"/healthcheck", 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// startGubernator starts one gubernator node bound to cpu (member-list
// discovery of itself: gubernator answers only once it is in its peer
// list).
func (r *runner) startGubernator(ctx context.Context, cpu int, name string, b anchorBins) (*server, error) {
	addrs, err := freeport.Addrs(3)
	if err != nil {
		return nil, err
	}
	env := []string{
		"GUBER_GRPC_ADDRESS=" + addrs[0], "GUBER_HTTP_ADDRESS=" + addrs[1], "GUBER_ADVERTISE_ADDRESS=" + addrs[0],
		"GUBER_PEER_DISCOVERY_TYPE=member-list", "GUBER_MEMBERLIST_ADDRESS=" + addrs[2],
		"GUBER_MEMBERLIST_BIND_ADDRESS=" + addrs[2], "GUBER_MEMBERLIST_KNOWN_NODES=" + addrs[2],
		"GUBER_LOG_LEVEL=warn",
	}
	bin, args := onCPU(cpu, b.gubernator)
	s := &server{name: name, grpc: addrs[0], addr: addrs[0], http: addrs[1]}
	if s.proc, err = r.start(name, r.lifetime(), env, bin, args...); err != nil {
		return nil, err
	}
	if err := waitHTTP200(ctx, s.proc, "http://"+addrs[1]+"/v1/HealthCheck", 30*time.Second); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func splitAddr(a string) (host, port string) {
	i := strings.LastIndexByte(a, ':')
	return a[:i], a[i+1:]
}
