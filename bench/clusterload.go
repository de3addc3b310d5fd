package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// Cluster-load scenario shape: the shipped activity_create bucket (100
// per second per tenant) on three nodes, one tenant offered 1000 checks/s
// in all, a third through each node.
const (
	clusterLoadNodes = 3
	clusterLoadLimit = 100
	clusterLoadRate  = 1000.0
	// clusterLoadSlack is what one node may admit over the limit in a
	// window with NATS down: a check is put in the window of its call's
	// midpoint, so one sent just before a window's end may be counted in
	// the next.
	clusterLoadSlack = 2
)

// clusterLoadPhases are how long NATS is up, then down, then back up.
func (r *runner) clusterLoadPhases() (up, down, back time.Duration) {
	if r.opt.quick {
		return 4 * time.Second, 3 * time.Second, 3 * time.Second
	}
	return 10 * time.Second, 5 * time.Second, 5 * time.Second
}

func (r *runner) clusterLoadEstimate() time.Duration {
	up, down, back := r.clusterLoadPhases()
	return up + down + back + 10*time.Second
}

// clusterLoad is the cluster-load scenario: three nodes on one NATS under a steady load
// of ten times the shipped activity_create limit, one tenant spread evenly
// over the nodes, while NATS is up, then stopped, then back. With NATS up
// the cluster holds the limit together; with NATS down each node counts
// alone and admits up to the limit itself (so up to three times it in
// all), never more; once NATS is back and the nodes have reconnected the
// cluster holds the limit together again. It reports the admitted checks
// per window, per node and in all, and each node's batches per second.
func (r *runner) clusterLoad(ctx context.Context) error {
	up, down, back := r.clusterLoadPhases()
	cl := &ClusterLoad{Nodes: clusterLoadNodes, Limit: clusterLoadLimit, RatePerNode: round1(clusterLoadRate / clusterLoadNodes),
		SyncInterval: clusterSync.String(), UpS: up.Seconds(), DownS: down.Seconds(), BackS: back.Seconds()}
	r.res.ClusterLoad = cl
	h, err := r.startCluster(ctx, "s5", clusterLoadNodes, shippedConfigPath(r.root), clusterSync)
	if err != nil {
		return err
	}
	defer h.stop()
	const batches = "ratelimit_authz_replicate_batches_sent_total"
	const connected = "ratelimit_authz_replicate_connected"

	// Start just after a window boundary, so the first window is nearly
	// whole (it is dropped as partial all the same). The phases are timed
	// from when every node has counted a check of the load: each load
	// process takes a moment to start. The loads run a little longer than
	// the phases, so the last phase is not cut short by that moment.
	total := up + down + back
	var loads []load
	for _, n := range h.nodes {
		loads = append(loads, load{n.name, []string{"check", "--target", n.grpc, "--connections", "1", "--routes", "activities",
			"--keys", "uniform", "--tenants", "1", "--key-prefix", "s5-",
			"--rate", strconv.FormatFloat(cl.RatePerNode, 'f', -1, 64), "--concurrency", "4",
			"--duration", (total + 2*time.Second).String(), "--warmup", "0", "--timeout", "1s", "--window", "1s"}})
	}
	wait := r.loadsAtOnce(ctx, total+2*time.Second, loads)
	// Whatever happens below, the loads end by their --duration.
	defer wait()
	// every is a check that every node's metric is x (-1: above 0).
	every := func(metric string, x float64) func() error {
		return func() error {
			got, err := h.metric(metric)
			for i, v := range got {
				if v != x && (x != -1 || v <= 0) && err == nil {
					err = fmt.Errorf("%s: %s is %v", h.nodes[i].name, metric, v)
				}
			}
			return err
		}
	}
	if err := poll.Wait(30*time.Second, 10*time.Millisecond, every("ratelimit_authz_checks_total", -1)); err != nil {
		return fmt.Errorf("the load did not start: %w", err)
	}
	start := time.Now()
	b0, err := h.metric(batches)
	if err != nil {
		return err
	}
	cli.Sleep(ctx, time.Until(start.Add(up)))
	b1, err := h.metric(batches)
	if err != nil {
		return err
	}
	upElapsed := time.Since(start)
	for i := range b1 {
		cl.BatchesPerS = append(cl.BatchesPerS, round1((b1[i]-b0[i])/upElapsed.Seconds()))
	}
	stopAt := time.Now()
	h.stopNATS()
	if err := poll.Wait(20*time.Second, 20*time.Millisecond, every(connected, 0)); err != nil {
		return fmt.Errorf("after NATS stopped: %w", err)
	}
	cl.DisconnectedS = round(time.Since(stopAt).Seconds(), 3)
	cli.Sleep(ctx, time.Until(stopAt.Add(down)))
	restartAt := time.Now()
	if err := h.startNATS(ctx); err != nil {
		return fmt.Errorf("start NATS again: %w", err)
	}
	// The nodes reconnect within the NATS client's reconnect wait; until
	// then they still count alone.
	if err := poll.Wait(20*time.Second, 10*time.Millisecond, every(connected, 1)); err != nil {
		return fmt.Errorf("after NATS restarted: %w", err)
	}
	backAt := time.Now()
	cl.StopAtS = round(stopAt.Sub(start).Seconds(), 3)
	cl.RestartAtS = round(restartAt.Sub(start).Seconds(), 3)
	cl.ReconnectedS = round(backAt.Sub(restartAt).Seconds(), 3)
	runs, err := wait()
	if err != nil {
		return err
	}
	for _, run := range runs {
		cl.Errors += run.Errors
	}
	cl.Windows = clusterLoadWindows(runs, start, stopAt, restartAt, backAt)
	cl.Phases = clusterLoadSummary(cl.Windows, clusterLoadNodes, clusterLoadLimit)

	return nil
}

// clusterLoadWindows merges the per-node windows of runs (in node order)
// and names each window's phase by the moments every node was under load
// (start), NATS was stopped, started again, and all nodes had
// reconnected: up (wholly between the start and the stop), down (wholly
// between the stop and the restart), back (wholly after the
// reconnection), transition (across the stop, the restart or the
// reconnection), and partial (before the start, and the last window,
// which the load did not fill).
func clusterLoadWindows(runs []*loadRun, start, stopAt, restartAt, backAt time.Time) []ClusterLoadWindow {
	per := map[int64][]int64{}
	for i, res := range runs {
		for _, w := range res.Windows {
			if per[w.StartMS] == nil {
				per[w.StartMS] = make([]int64, len(runs))
			}
			per[w.StartMS][i] += w.Allowed
		}
	}
	starts := slices.Sorted(maps.Keys(per))
	var out []ClusterLoadWindow
	for i, s := range starts {
		w := ClusterLoadWindow{StartMS: s, PerNode: per[s]}
		for _, n := range w.PerNode {
			w.Total += n
		}
		end := time.UnixMilli(s + 1000)
		begin := time.UnixMilli(s)
		switch {
		case begin.Before(start) || i == len(starts)-1:
			w.Phase = "partial"
		case !end.After(stopAt):
			w.Phase = "up"
		case !begin.Before(stopAt) && !end.After(restartAt):
			w.Phase = "down"
		case !begin.Before(backAt):
			w.Phase = "back"
		default:
			w.Phase = "transition"
		}
		out = append(out, w)
	}
	return out
}

// clusterLoadSummary sums up the windows of each phase against what the
// cluster promises: at most 1.1× the limit in all with NATS up and after
// it is back; with it down, each node at most the limit (plus the slack
// of a window edge) and, all together, at least 90% of the nodes' limits
// (each node counts alone and none stops short).
func clusterLoadSummary(ws []ClusterLoadWindow, nodes, limit int) []ClusterLoadPhase {
	var out []ClusterLoadPhase
	for _, phase := range []string{"up", "down", "back"} {
		p := ClusterLoadPhase{Phase: phase}
		var totals []int64
		for _, w := range ws {
			if w.Phase != phase {
				continue
			}
			totals = append(totals, w.Total)
			p.MaxPerNode = max(p.MaxPerNode, slices.Max(w.PerNode))
		}
		p.Windows = len(totals)
		switch phase {
		case "down":
			p.Expected = fmt.Sprintf("each node ≤ %d, all ≥ %d", limit+clusterLoadSlack, nodes*limit*9/10)
		default:
			p.Expected = fmt.Sprintf("all ≤ %d", limit*11/10)
		}
		if len(totals) > 0 {
			slices.Sort(totals)
			p.Min, p.Max = totals[0], totals[len(totals)-1]
			p.P90 = totals[min(len(totals)-1, len(totals)*9/10)]
			xs := make([]float64, len(totals))
			for i, t := range totals {
				xs[i] = float64(t)
			}
			p.Median = median(xs)
			met := p.Max <= int64(limit*11/10)
			if phase == "down" {
				met = p.MaxPerNode <= int64(limit+clusterLoadSlack) && p.Min >= int64(nodes*limit*9/10)
			}
			p.Met = &met
		}
		out = append(out, p)
	}
	return out
}

// ClusterLoad is the cluster-load scenario: a cluster under steady load through a NATS
// outage.
type ClusterLoad struct {
	Nodes        int     `json:"nodes"`
	Limit        int     `json:"limit"` // per 1 s window and tenant
	RatePerNode  float64 `json:"rate_per_node"`
	SyncInterval string  `json:"sync_interval"`
	UpS          float64 `json:"up_s"` // planned phases
	DownS        float64 `json:"down_s"`
	BackS        float64 `json:"back_s"`
	// When NATS was stopped and started again (s after the load started),
	// and how long after each every node reported itself disconnected,
	// then connected (ratelimit_authz_replicate_connected).
	StopAtS       float64 `json:"nats_stopped_at_s"`
	DisconnectedS float64 `json:"all_disconnected_after_s"`
	RestartAtS    float64 `json:"nats_restarted_at_s"`
	ReconnectedS  float64 `json:"all_reconnected_after_s"`
	// BatchesPerS is each node's batches published per second with NATS
	// up (ratelimit_authz_replicate_batches_sent_total).
	BatchesPerS []float64           `json:"batches_per_s_nats_up"`
	Errors      int64               `json:"errors"`
	Phases      []ClusterLoadPhase  `json:"phases"`
	Windows     []ClusterLoadWindow `json:"windows"`
}

// ClusterLoadWindow is one 1 s window of the cluster-load scenario.
type ClusterLoadWindow struct {
	StartMS int64   `json:"start_ms"`
	Phase   string  `json:"phase"` // partial, up, down, transition, back
	PerNode []int64 `json:"admitted_per_node"`
	Total   int64   `json:"admitted"`
}

// ClusterLoadPhase sums up the windows of one phase (NATS up, down, back)
// against what the cluster promises in it (reported, not asserted).
type ClusterLoadPhase struct {
	Phase      string  `json:"phase"`
	Windows    int     `json:"windows"`
	Min        int64   `json:"min"`
	Median     float64 `json:"median"`
	P90        int64   `json:"p90"`
	Max        int64   `json:"max"`
	MaxPerNode int64   `json:"max_per_node"`
	Expected   string  `json:"expected"`
	Met        *bool   `json:"met"` // nil: no window in the phase
}
