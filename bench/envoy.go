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
	e := &EnvoyE2E{Plan: r.opt.plan(0, 0), Workers: envoyWorkers}
	r.res.Envoy = e
	be, addrs, err := r.startEnvoyBackends(ctx, "s4", 5)
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
	stop, err := r.startEnvoys(ctx, be, envoySpec{"s4-envoy", addrs[1], cfg})
	if err != nil {
		return err
	}
	defer stop()
	listeners := []listener{{"off", addrs[4]}, {"noop", addrs[3]}, {"on", addrs[2]}}
	err = r.throughEnvoy(ctx, "s4", listeners, envoyLoad, be.srv.proc, func(c int, got map[string][]*loadRun, lat map[string]Lat, rps map[string]float64, errs int64) {
		row := EnvoyRow{Concurrency: c, Errors: errs}
		row.On, row.Noop, row.Off = lat["on"], lat["noop"], lat["off"]
		row.OnRPS, row.NoopRPS, row.OffRPS = rps["on"], rps["noop"], rps["off"]
		row.AddedP50, row.AddedP99 = round1(row.On.P50-row.Off.P50), round1(row.On.P99-row.Off.P99)
		row.NoopAddedP50, row.NoopAddedP99 = round1(row.Noop.P50-row.Off.P50), round1(row.Noop.P99-row.Off.P99)
		e.Rows = append(e.Rows, row)
		for _, l := range listeners {
			e.CDFs = append(e.CDFs, CDFSeries{Group: fmt.Sprintf("c=%d", c), Label: envoyLabels[l.name], Points: medianRun(got[l.name]).CDF})
		}
	})
	if err != nil {
		return err
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
// prefix-server, and returns them and n free addresses, the app on the
// first, for the scenario's Envoys; on error none is left running.
func (r *runner) startEnvoyBackends(ctx context.Context, prefix string, n int) (*envoyBackends, []string, error) {
	if r.bins.envoy == "" {
		return nil, nil, fmt.Errorf("no envoy binary (scripts/install-envoy.sh)")
	}
	addrs, err := freeport.Addrs(n)
	if err != nil {
		return nil, nil, err
	}
	be := &envoyBackends{appAddr: addrs[0]}
	be.up, err = r.start(prefix+"-upstream", r.lifetime(), nil, r.bins.bench, "upstream", "--addr", be.appAddr, "--lifetime", r.lifetime().String())
	if err != nil {
		return nil, nil, err
	}
	if be.srv, err = r.startServer(ctx, -1, prefix+"-server", nil, true, r.bins.server, r.serve(r.allowedCfg)...); err != nil {
		be.up.stop()
		return nil, nil, err
	}
	return be, addrs, nil
}

// waitApp waits until the upstream app answers.
func (be *envoyBackends) waitApp(ctx context.Context) error {
	return waitHTTP200(ctx, be.up, "http://"+be.appAddr+"/", 10*time.Second)
}

func (be *envoyBackends) stop() {
	be.srv.stop()
	be.up.stop()
}

// envoySpec is an Envoy to start: its name, admin address and bootstrap.
type envoySpec struct {
	name, admin string
	cfg         []byte
}

// startEnvoys starts an Envoy of envoyWorkers workers for each spec and
// waits until each admin says it is ready and be's app answers; stop
// stops them. On error none is left running.
func (r *runner) startEnvoys(ctx context.Context, be *envoyBackends, specs ...envoySpec) (stop func(), err error) {
	var ps []*proc
	stop = func() {
		for _, p := range ps {
			p.stop()
		}
	}
	for _, e := range specs {
		path := filepath.Join(r.tmp, e.name+".yaml")
		if err := os.WriteFile(path, e.cfg, 0o644); err != nil {
			stop()
			return nil, err
		}
		p, err := r.start(e.name, r.lifetime(), nil, r.bins.envoy, "-c", path, "--concurrency", strconv.Itoa(envoyWorkers),
			"--disable-hot-restart", "--log-level", "warn")
		if err != nil {
			stop()
			return nil, err
		}
		ps = append(ps, p)
		if err := waitHTTP200(ctx, p, "http://"+e.admin+"/ready", 30*time.Second); err != nil {
			stop()
			return nil, err
		}
	}
	if err := be.waitApp(ctx); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// listener is an Envoy listener a scenario sends its load through.
type listener struct{ name, addr string }

// throughEnvoy runs load through each listener at each of
// envoyConcurrency, the listeners in turn within each round, noting srv's
// CPU per request; each gets, for a concurrency, each listener's runs,
// their median latency and rate, and the errors of all.
func (r *runner) throughEnvoy(ctx context.Context, prefix string, listeners []listener, load []string, srv *proc,
	each func(c int, got map[string][]*loadRun, lat map[string]Lat, rps map[string]float64, errs int64)) error {
	for _, c := range envoyConcurrency {
		got := map[string][]*loadRun{}
		err := r.rotate(len(listeners), func(round, i int) error {
			l := listeners[i]
			run, err := r.loadCPU(ctx, -1, fmt.Sprintf("%s-c%d-r%d-%s", prefix, c, round+1, l.name), srv,
				append([]string{"http", "--target", l.addr, "--concurrency", strconv.Itoa(c),
					"--duration", r.opt.run.String(), "--warmup", r.opt.warmup.String(), "--timeout", "2s"}, load...)...)
			got[l.name] = append(got[l.name], run)
			return err
		})
		if err != nil {
			return err
		}
		lat, rps, errs := listenerMedians(got)
		each(c, got, lat, rps, errs)
	}
	return nil
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
