package admin

import (
	"bytes"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// pageData is what page.html renders.
type pageData struct {
	Time     time.Time
	Refresh  int
	HideKeys bool
	Buckets  []pageBucket
	State    []stateRow
	Cluster  *Cluster // nil: not a cluster node
	// Config and Overrides are nil when Deps.State is.
	Config    *ConfigState
	Overrides *OverridesState
	// With ?cluster=1, the nodes merged in and those that did not answer.
	Nodes, Missing []string
}

// pageBucket is one bucket on the page.
type pageBucket struct{ BucketTops }

// pageRow is one row of a bucket's top keys: the n-th denied and the n-th
// admitted key, either nil past the end of its list.
type pageRow struct{ Denied, Admitted *top.Key }

// Rows pairs the minute's top denied and top admitted keys by rank.
func (b pageBucket) Rows() []pageRow {
	d, a := b.Minute.TopDenied, b.Minute.TopAdmitted
	rows := make([]pageRow, max(len(d), len(a)))
	for i := range rows {
		if i < len(d) {
			rows[i].Denied = &d[i]
		}
		if i < len(a) {
			rows[i].Admitted = &a[i]
		}
	}
	return rows
}

// WindowHits is key's denied hits in the bucket's current window, ""
// when it is not listed there.
func (b pageBucket) WindowHits(key string) string {
	if b.Window == nil {
		return ""
	}
	for _, k := range b.Window.TopDenied {
		if k.Key == key {
			return fmt.Sprint(k.Hits)
		}
	}
	return ""
}

// stateRow is one metric of the node's state.
type stateRow struct {
	Name, Labels, Value string
}

// stateMetrics are the metrics the page shows, by name without the
// ratelimit_authz_ prefix: the reloads and the overrides' freshness
// (beside their sections), the cluster, the listeners and the counter.
var stateMetrics = []string{
	"config_reloads_total",
	"overrides_degraded", "overrides_snapshot_age_seconds", "overrides_invalid_rows",
	"replicate_connected", "replicate_peers",
	"server_connections_open", "rlqs_streams", "failures_accesslog_streams_open",
	"counter_live_keys", "counter_max_keys", "counter_keys_refused_total",
}

func (s *Server) servePage(w http.ResponseWriter, r *http.Request) {
	resp, ok := s.read(w, r)
	if !ok {
		return
	}
	d := pageData{Time: resp.Time, Refresh: int(s.cfg.Refresh / time.Second), HideKeys: s.hashKey != nil, State: s.state(),
		Nodes: resp.Nodes, Missing: resp.Missing}
	for _, b := range resp.Buckets {
		d.Buckets = append(d.Buckets, pageBucket{b})
	}
	if s.deps.Cluster != nil {
		c := s.deps.Cluster()
		d.Cluster = &c
	}
	if s.deps.State != nil {
		c, o := s.deps.State.Config(), s.deps.State.Overrides()
		d.Config, d.Overrides = &c, &o
	}
	var buf bytes.Buffer
	if err := s.page.Execute(&buf, d); err != nil {
		s.log.Error("admin: render the status page", "err", err)
		http.Error(w, "cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// state reads stateMetrics from the node's registry.
func (s *Server) state() []stateRow {
	if s.deps.Gatherer == nil {
		return nil
	}
	mfs, err := s.deps.Gatherer.Gather()
	if err != nil {
		s.log.Debug("admin: gather metrics", "err", err)
	}
	var rows []stateRow
	for _, name := range stateMetrics {
		i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == "ratelimit_authz_"+name })
		if i < 0 {
			continue
		}
		for _, m := range mfs[i].GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			var v float64
			switch {
			case m.GetGauge() != nil:
				v = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				v = m.GetCounter().GetValue()
			default:
				continue
			}
			val := fmt.Sprintf("%g", v)
			if strings.HasSuffix(name, "_timestamp_seconds") && v > 0 {
				val = time.Unix(int64(v), 0).UTC().Format(time.RFC3339)
			}
			rows = append(rows, stateRow{Name: name, Labels: strings.Join(labels, " "), Value: val})
		}
	}
	return rows
}

// sparkBlocks are the eight heights of a sparkline.
var sparkBlocks = []rune("▁▂▃▄▅▆▇█")

// spark draws the per-epoch hits of one outcome (denied when denied,
// else admitted) as a line of block characters, scaled to the largest.
func spark(epochs []top.Count, denied bool) string {
	var peak uint64
	for _, c := range epochs {
		peak = max(peak, pick(c, denied))
	}
	var b strings.Builder
	for _, c := range epochs {
		i := 0
		if peak > 0 {
			i = int(math.Round(float64(pick(c, denied)) / float64(peak) * float64(len(sparkBlocks)-1)))
		}
		b.WriteRune(sparkBlocks[i])
	}
	return b.String()
}

func pick(c top.Count, denied bool) uint64 {
	if denied {
		return c.Denied
	}
	return c.Admitted
}

// rate is hits per second over p, to three significant digits.
func rate(p top.Period, denied bool) string {
	n := p.Admitted
	if denied {
		n = p.Denied
	}
	return top.Rate(n, p.End.Sub(p.Start).Seconds())
}

// ago is how long before now t was, to the millisecond; "never" for the
// zero time.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(time.Millisecond).String() + " ago"
}

// windowText is a window length in ms as a duration; "in flight" for a
// bucket of requests in flight, which has none.
func windowText(ms int64) string {
	if ms == 0 {
		return "in flight"
	}
	return limits.FormatWindow(ms)
}
