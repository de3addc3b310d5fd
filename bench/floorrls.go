package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
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
//   - the anchors (anchors.go): envoyproxy/ratelimit with Redis
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
