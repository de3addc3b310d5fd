package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// envoyConcurrency are the client concurrencies of scenario 4.
var envoyConcurrency = []int{1, 16}

// envoyWorkers is Envoy's --concurrency: one worker thread, so that
// Envoy, the server, the upstream and the client share the two cores
// without Envoy taking both.
const envoyWorkers = 1

// envoyLoad is the end-to-end request stream: activity writes and inbound
// webhooks (headers only, as Envoy sends them), limits out of reach.
var envoyLoad = []string{"--routes", "activities,inbound", "--keys", "zipf"}

// envoyRunsTime is the time of the load runs of a scenario of three
// Envoy listeners (envoy, rlqs).
func (r *runner) envoyRunsTime() time.Duration {
	per := r.opt.run + r.opt.warmup + 300*time.Millisecond
	return time.Duration(len(envoyConcurrency)*r.opt.rounds*3) * per
}

func (r *runner) envoyEstimate() time.Duration { return r.envoyRunsTime() + 4*time.Second }

// envoy is scenario 4: the same requests through one Envoy on three
// listeners: the ext_authz filter disabled on the route (off), on with the
// no-op server behind it (noop), and on with ratelimit-authz (on). What
// the filter adds is on − off, of which noop − off is the ext_authz round
// trip itself. The listeners alternate within each round, in a rotating
// order.
func (r *runner) envoy(ctx context.Context) error {
	if r.bins.envoy == "" {
		return fmt.Errorf("no envoy binary (scripts/install-envoy.sh)")
	}
	e := &EnvoyE2E{Plan: r.opt.plan(0, 0), Workers: envoyWorkers}
	r.res.Envoy = e
	addrs, err := freeport.Addrs(5)
	if err != nil {
		return err
	}
	be, err := r.startEnvoyBackends(ctx, "s4", addrs[0])
	if err != nil {
		return err
	}
	defer be.stop()
	noop, err := r.startNoop(ctx, "s4-noop")
	if err != nil {
		return err
	}
	defer noop.stop()
	cfg, err := envoyConfig(r.root, envoyAddrs{Admin: addrs[1], On: addrs[2], Noop: addrs[3], Off: addrs[4], Authz: be.srv.grpc, Check: be.srv.addr, NoopAuthz: noop.grpc, App: addrs[0]})
	if err != nil {
		return err
	}
	envoy, err := r.startEnvoy(ctx, "s4-envoy", addrs[1], cfg)
	if err != nil {
		return err
	}
	defer envoy.stop()
	if err := be.waitApp(ctx); err != nil {
		return err
	}

	listeners := []listener{{"off", addrs[4]}, {"noop", addrs[3]}, {"on", addrs[2]}}
	for _, c := range envoyConcurrency {
		got, err := r.throughEnvoy(ctx, "s4", c, listeners, envoyLoad, be.srv.proc)
		if err != nil {
			return err
		}
		row := EnvoyRow{Concurrency: c}
		var lat map[string]Lat
		var rps map[string]float64
		lat, rps, row.Errors = listenerMedians(got)
		row.On, row.Noop, row.Off = lat["on"], lat["noop"], lat["off"]
		row.OnRPS, row.NoopRPS, row.OffRPS = rps["on"], rps["noop"], rps["off"]
		row.AddedP50, row.AddedP99 = round1(row.On.P50-row.Off.P50), round1(row.On.P99-row.Off.P99)
		row.NoopAddedP50, row.NoopAddedP99 = round1(row.Noop.P50-row.Off.P50), round1(row.Noop.P99-row.Off.P99)
		e.Rows = append(e.Rows, row)
		for _, l := range listeners {
			e.CDFs = append(e.CDFs, CDFSeries{Group: fmt.Sprintf("c=%d", c), Label: envoyLabels[l.name], Points: medianRun(got[l.name]).CDF})
		}
	}
	stats, err := scrape.EnvoyStats(httpClient, "http://"+addrs[1], "ext_authz")
	if err != nil {
		return err
	}
	e.Stats = make(map[string]float64, len(stats))
	for name, v := range stats {
		e.Stats[name] = float64(v)
	}
	if e.Stats["http.authz_on.ext_authz.ok"] == 0 || e.Stats["http.authz_noop.ext_authz.ok"] == 0 || e.Stats["http.authz_off.ext_authz.ok"] != 0 {
		return fmt.Errorf("the filter was not on where expected: %v", e.Stats)
	}
	return nil
}

// envoyBackends are what the Envoys of a scenario route to: the
// upstream app, and ratelimit-authz of the allowed configuration with its
// gRPC port and its lean Check listener.
type envoyBackends struct {
	up      *proc
	srv     *server // addr: its lean Check listener
	appAddr string
}

// startEnvoyBackends starts the backends, named prefix-upstream and
// prefix-server, the app on appAddr; on error none is left running.
func (r *runner) startEnvoyBackends(ctx context.Context, prefix, appAddr string) (*envoyBackends, error) {
	be := &envoyBackends{appAddr: appAddr}
	var err error
	be.up, err = r.start(prefix+"-upstream", r.lifetime(), nil, r.bins.bench, "upstream", "--addr", appAddr, "--lifetime", r.lifetime().String())
	if err != nil {
		return nil, err
	}
	if be.srv, err = r.startServer(ctx, -1, prefix+"-server", nil, true, r.bins.server, r.serve(r.allowedCfg)...); err != nil {
		be.up.stop()
		return nil, err
	}
	return be, nil
}

// waitApp waits until the upstream app answers.
func (be *envoyBackends) waitApp(ctx context.Context) error {
	return waitHTTP200(ctx, be.up, "http://"+be.appAddr+"/", 10*time.Second)
}

func (be *envoyBackends) stop() {
	be.srv.stop()
	be.up.stop()
}

// startEnvoy starts an Envoy of envoyWorkers workers on cfg and waits
// until its admin, on adminAddr, says it is ready; on error it is
// stopped.
func (r *runner) startEnvoy(ctx context.Context, name, adminAddr string, cfg []byte) (*proc, error) {
	path := filepath.Join(r.tmp, name+".yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return nil, err
	}
	p, err := r.start(name, r.lifetime(), nil, r.bins.envoy, "-c", path, "--concurrency", strconv.Itoa(envoyWorkers),
		"--disable-hot-restart", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	if err := waitHTTP200(ctx, p, "http://"+adminAddr+"/ready", 30*time.Second); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// listener is an Envoy listener a scenario sends its load through.
type listener struct{ name, addr string }

// throughEnvoy runs load at concurrency c through each listener, the
// listeners in turn within each round, noting srv's CPU per request; it
// returns each listener's runs.
func (r *runner) throughEnvoy(ctx context.Context, prefix string, c int, listeners []listener, load []string, srv *proc) (map[string][]*loadRun, error) {
	got := map[string][]*loadRun{}
	err := r.rotate(len(listeners), func(round, i int) error {
		l := listeners[i]
		run, err := r.loadCPU(ctx, -1, fmt.Sprintf("%s-c%d-r%d-%s", prefix, c, round+1, l.name), srv,
			append([]string{"http", "--target", l.addr, "--concurrency", strconv.Itoa(c),
				"--duration", r.opt.run.String(), "--warmup", r.opt.warmup.String(), "--timeout", "2s"}, load...)...)
		got[l.name] = append(got[l.name], run)
		return err
	})
	return got, err
}

// listenerMedians are, for each listener, the median latency and rate of
// its runs, and the errors of all the runs.
func listenerMedians(got map[string][]*loadRun) (map[string]Lat, map[string]float64, int64) {
	lat := map[string]Lat{}
	rps := map[string]float64{}
	var errs int64
	for name, runs := range got {
		var ls []Lat
		var xs []float64
		for _, run := range runs {
			ls, xs = append(ls, latOf(run)), append(xs, run.RPS)
			errs += run.Errors
		}
		lat[name], rps[name] = medianLat(ls), round1(median(xs))
	}
	return lat, rps, errs
}

// envoyAddrs are the addresses of the end-to-end scenario.
type envoyAddrs struct {
	Admin, On, Noop, Off  string // Envoy's admin and its three listeners
	Authz, NoopAuthz, App string // ratelimit-authz's gRPC port, the no-op server, the upstream
	Check                 string // ratelimit-authz's lean Check listener
}

// envoyConfig is the shipped bootstrap (envoy/ratelimit-authz.yaml, as
// users copy it: routes, failure access log, retries, health checks)
// with three listeners instead of its one, alike but for the ext_authz
// filter: on with ratelimit-authz as shipped, its lean Check listener
// (authz_on), on with the no-op server
// (authz_noop, a second check cluster; none without a.Noop) and left
// out (authz_off). on − off is what the filter costs; noop − off is the
// part of it any ext_authz server costs.
func envoyConfig(root string, a envoyAddrs) ([]byte, error) {
	src, err := os.ReadFile(filepath.Join(root, envoyconf.Path))
	if err != nil {
		return nil, err
	}
	cfg, err := envoyconf.Render(src, envoyconf.Addrs{Admin: a.Admin, Listener: a.On, Authz: []string{a.Authz}, Check: []string{a.Check}, App: a.App})
	if err != nil {
		return nil, err
	}
	listeners := []envoyconf.Listener{{Name: "authz_on", Addr: a.On, Authz: envoyconf.ShippedCheckCluster}}
	if a.Noop != "" {
		if cfg, err = envoyconf.WithAuthzCluster(cfg, "noop_authz", a.NoopAuthz); err != nil {
			return nil, err
		}
		listeners = append(listeners, envoyconf.Listener{Name: "authz_noop", Addr: a.Noop, Authz: "noop_authz"})
	}
	return envoyconf.WithListeners(cfg, append(listeners, envoyconf.Listener{Name: "authz_off", Addr: a.Off})...)
}

// envoyLabels name the listeners in plots.
var envoyLabels = map[string]string{"off": "filter off", "noop": "filter on, no-op server", "on": "filter on, ratelimit-authz"}
