package main

import (
	"math"
	"strconv"
	"time"
)

// The scale model of docs/replication-scale.md: replication messages,
// bytes and merges per node as functions of the node count N, the active
// keys K and the keys a node changes per sync interval, for the current
// design (every changed key goes to every node) and for budget shares
// (only keys near their share are sent: hot keys at most as today, a flood of
// keys hit once costs nothing). predictScale applies it to the shape of
// BenchmarkReplicationScale, so its figures stand beside the measured ones.

// design is a replication rule the model predicts for.
type design int

const (
	designNow    design = iota // every changed key in the next batch
	designShares               // only keys near their share
)

// scaleShape is what the model needs of a load and a configuration. The
// values of benchShape are those of internal/replicate/scale_bench_test.go and
// the replicate defaults it runs with.
type scaleShape struct {
	SyncS      float64 // sync interval
	EarlyGapS  float64 // least time between early batches
	HeartbeatS float64 // an idle node's empty batch
	HotKeys    int
	HotLimit   float64 // per window
	HotWindowS float64
	FloodScale time.Duration
	HotPrefix  string // hot keys are HotPrefix + 0..HotKeys-1
	FloodPfx   string // flood keys are FloodPfx + 0..hits-1
	Subject    string // the batch subject, counted with each message
	Bucket     string // the bucket's name, sent once per message
	NodePrefix string // node ids are NodePrefix + 0..N-1
}

// hotRate is the hot load's hits per second over the whole cluster.
const hotRate = 20_000.0

var benchShape = scaleShape{
	SyncS: 0.1, EarlyGapS: 0.01, HeartbeatS: 1,
	HotKeys: 100, HotLimit: 250, HotWindowS: 1, FloodScale: time.Minute,
	HotPrefix: "hot-", FloodPfx: "ip-", Subject: "scale.batch", Bucket: "activity_create", NodePrefix: "n",
}

// ScalePrediction is the model's figures for one node count and load,
// per node; the per-1k figures are per thousand hits of the whole
// cluster, as the benchmark reports them.
type ScalePrediction struct {
	OutB   float64 `json:"out_b_per_1k"`
	InB    float64 `json:"in_b_per_1k"`
	InMsgs float64 `json:"in_msgs_per_1k"`
	Merged float64 `json:"merged_per_1k"`
	Sent   float64 `json:"sent_per_1k"`
	InBPS  float64 `json:"in_b_per_s"`
	// BatchesPS is the batches a node publishes per second; EntryB and
	// MessageB the bytes of one entry and of one message without its
	// entries (subject included).
	BatchesPS float64 `json:"batches_per_s"`
	EntryB    float64 `json:"entry_b"`
	MessageB  float64 `json:"message_b"`
	// CPUUS is the CPU per hit from the fitted CPU model (0: no fit).
	CPUUS float64 `json:"cpu_us_per_hit,omitempty"`
}

// uvarintLen is the bytes of x as an unsigned varint.
func uvarintLen(x uint64) float64 {
	n := 1.0
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// avgDecimalLen is the mean length of strconv.Itoa(i) for i in [0, n).
func avgDecimalLen(n int) float64 {
	if n <= 0 {
		return 1
	}
	total, lo := 0, 0
	for digits, hi := 1, 10; lo < n; digits, hi = digits+1, hi*10 {
		total += digits * (min(hi, n) - lo)
		lo = hi
	}
	return float64(total) / float64(n)
}

// entryBytes is one batch entry (wire.go): limit index, window offset,
// the key as a length-prefixed string and the count, each a varint.
func entryBytes(keyLen, countLen float64) float64 {
	return 1 + 1 + uvarintLen(uint64(keyLen)) + keyLen + countLen
}

// messageBytes is a batch message without its entries: the subject, magic,
// version and kind, the node id, incarnation, send time (a zigzag varint
// of the unix ms), the sequence number (two bytes after the first 128),
// the bucket table (one bucket) and the entry count.
func messageBytes(sh scaleShape, nodes int, scale time.Duration, entries float64) float64 {
	nowMS := uint64(time.Now().UnixMilli()) << 1
	limits := 1.0
	if entries > 0 {
		limits += 1 + float64(len(sh.Bucket)) + uvarintLen(uint64(scale.Milliseconds())) + 1
	}
	return float64(len(sh.Subject)) + 4 + 1 + float64(len(sh.NodePrefix)) + avgDecimalLen(nodes) + 8 +
		uvarintLen(nowMS) + 2 + limits + uvarintLen(uint64(max(entries, 0)))
}

// busy is the chance that a slot of length s holds at least one of a
// node's hits arriving at rate (a Poisson stream): a batch goes out only
// if something changed.
func busy(rate, s float64) float64 { return 1 - math.Exp(-rate*s) }

// distinct is the keys a node changes with m hits over k keys. The
// benchmark's nodes go round the keys in turn, so m hits touch min(k, m);
// uniformly random keys would touch k(1 − e^(−m/k)).
func distinct(k int, m float64) float64 { return math.Min(float64(k), m) }

// predictScale is the model for nodes nodes under load ("hot" or "flood")
// at rate hits/s of the whole cluster; hits is the benchmark's count
// (the flood's keys are that many).
func predictScale(sh scaleShape, d design, nodes int, load string, rate float64, hits int) ScalePrediction {
	var p ScalePrediction
	n := float64(nodes)
	perNode := rate / n // hits per second at each node
	if rate <= 0 {
		return p
	}
	var entriesPS float64 // entries a node publishes per second
	switch load {
	case "hot":
		// Before a key is past half its limit only ticks publish it; after,
		// every admitted hit makes its node publish within the early gap.
		// A node sees its own hits at once and its peers' (N−1)/N of the
		// count half an interval late on average. Budget shares send hot
		// keys as today, so both designs predict the same.
		perKey := rate / float64(sh.HotKeys)
		half := sh.HotLimit / 2 / perKey
		seen := math.Min(half+(n-1)/n*sh.SyncS/2, sh.HotWindowS)
		f := seen / sh.HotWindowS // share of each window before early batches start
		ticks := f / sh.SyncS * busy(perNode, sh.SyncS)
		early := (1 - f) / sh.EarlyGapS * busy(perNode, sh.EarlyGapS)
		p.BatchesPS = ticks + early
		entriesPS = ticks*distinct(sh.HotKeys, perNode*sh.SyncS) + early*distinct(sh.HotKeys, perNode*sh.EarlyGapS)
		perKeyNode := perKey * sh.HotWindowS / n // a node's count of a key at the window's end
		count := 1 + math.Max(0, 1-128/math.Max(perKeyNode, 1))
		p.EntryB = entryBytes(float64(len(sh.HotPrefix))+avgDecimalLen(sh.HotKeys), count)
		p.MessageB = messageBytes(sh, nodes, time.Duration(sh.HotWindowS*float64(time.Second)), entriesPS/math.Max(p.BatchesPS, 1e-9))
	case "flood":
		p.EntryB = entryBytes(float64(len(sh.FloodPfx))+avgDecimalLen(hits), 1)
		if d == designNow {
			// Every hit is a new key, sent once by its node at the next
			// tick: one batch per interval while the flood lasts.
			p.BatchesPS = 1 / sh.SyncS
			entriesPS = perNode
		} else {
			// No key is near its share: at most a heartbeat a second.
			p.BatchesPS = 1 / sh.HeartbeatS
		}
		p.MessageB = messageBytes(sh, nodes, sh.FloodScale, entriesPS/p.BatchesPS)
	default:
		return p
	}
	outPS := p.BatchesPS*p.MessageB + entriesPS*p.EntryB
	per1k := 1000 / rate
	p.OutB = round1(outPS * per1k)
	p.InB = round1((n - 1) * outPS * per1k)
	p.InMsgs = round((n-1)*p.BatchesPS*per1k, 4)
	p.Sent = round(entriesPS*per1k, 3)
	p.Merged = round((n-1)*entriesPS*per1k, 3)
	p.InBPS = round1((n - 1) * outPS)
	p.BatchesPS, p.EntryB, p.MessageB = round(p.BatchesPS, 2), round(p.EntryB, 2), round(p.MessageB, 2)
	return p
}

// ScaleCPUFit is CPU per hit of the benchmark's process as a linear
// function of the entries merged per hit over the cluster, fitted to the
// flood rows of one tree, whose work is almost all entries (a flood
// sends few messages): cpu/hit = Base + PerEntry × entries merged per hit.
// A flood entry creates its key on the receiver, a hot entry updates one
// and comes with many small messages: the fit says nothing of the hot
// rows, and is not applied to them.
type ScaleCPUFit struct {
	Tree       string  `json:"tree"`
	BaseUS     float64 `json:"base_us"`
	PerEntryUS float64 `json:"per_entry_us"`
	// WorstResidual is the largest |measured − fitted| / measured over
	// the rows fitted.
	WorstResidual float64 `json:"worst_residual"`
}

// mergedPerHit is a row's entries merged per hit over the whole cluster.
func mergedPerHit(nodes int, merged1k float64) float64 { return float64(nodes) * merged1k / 1000 }

// fitScaleCPU fits the CPU model to the before tree's flood rows (the
// after tree's without a before) and puts its prediction in the flood
// rows' models.
func fitScaleCPU(rows []ScaleRow) *ScaleCPUFit {
	tree := "before"
	pick := func(r ScaleRow) *ScaleMetrics { return r.Before }
	if len(rows) > 0 && rows[0].Before == nil {
		tree, pick = "after", func(r ScaleRow) *ScaleMetrics { return r.After }
	}
	var xs, ys []float64
	for _, r := range rows {
		if m := pick(r); m != nil && r.Load == "flood" {
			xs = append(xs, mergedPerHit(r.Nodes, m.value(mMerged)))
			ys = append(ys, m.value(mCPU))
		}
	}
	base, slope, ok := leastSquares(xs, ys)
	if ok && base < 0 {
		// Noise can tilt the line below the origin; a hit costs something.
		base, slope = 0, throughOrigin(xs, ys)
	}
	if !ok || slope <= 0 {
		return nil
	}
	fit := &ScaleCPUFit{Tree: tree, BaseUS: round(base, 3), PerEntryUS: round(slope, 4)}
	for i, x := range xs {
		if ys[i] > 0 {
			fit.WorstResidual = math.Max(fit.WorstResidual, math.Abs(ys[i]-(base+slope*x))/ys[i])
		}
	}
	fit.WorstResidual = round(fit.WorstResidual, 3)
	for i := range rows {
		if rows[i].Load != "flood" {
			continue
		}
		for _, p := range []*ScalePrediction{&rows[i].Model, &rows[i].ModelShares} {
			p.CPUUS = round(base+slope*mergedPerHit(rows[i].Nodes, p.Merged), 2)
		}
	}
	return fit
}

// leastSquares fits y ≈ a + b·x; it needs two distinct x.
func leastSquares(xs, ys []float64) (a, b float64, ok bool) {
	var sx, sy, sxx, sxy float64
	for i, x := range xs {
		sx, sy, sxx, sxy = sx+x, sy+ys[i], sxx+x*x, sxy+x*ys[i]
	}
	n := float64(len(xs))
	det := n*sxx - sx*sx
	if len(xs) < 2 || math.Abs(det) < 1e-12 {
		return 0, 0, false
	}
	b = (n*sxy - sx*sy) / det
	return (sy - b*sx) / n, b, true
}

// ScaleSaturation is the node count at which NATS runs out of CPU for one
// case of batch rate, from the model's batches per node and the measured
// cost per publish and per delivery.
type ScaleSaturation struct {
	Case      string  `json:"case"`
	BatchesPS float64 `json:"batches_per_node_s"` // at the one-server saturation
	MessageB  float64 `json:"message_b"`          // a batch, entries included, at that N
	// OneServer and ThreeServers are the smallest N at which the server
	// (each server of a three-server full mesh) needs a whole core.
	OneServer    int `json:"one_server_nodes"`
	ThreeServers int `json:"three_servers_nodes"`
	// DeliveriesPS and BytesPS are what one server delivers at OneServer.
	DeliveriesPS float64 `json:"deliveries_per_s"`
	BytesPS      float64 `json:"bytes_per_s"`
}

// maxSaturationNodes bounds the search: beyond it the answer is "more".
const maxSaturationNodes = 100_000

// saturation finds, for the hot load of the benchmark, for that load
// growing with the cluster (each node as busy as at 30 nodes, each key's
// limit growing with its rate) and for a node publishing every batch it
// may (a tick and an early batch per gap, every key always near its
// limit), the node counts at which one nats-server, and each server of
// three, needs a whole core.
//
// One server: every batch is published to it once and delivered to the
// N−1 other nodes: cores = a·N·B + b·N(N−1)·B. Three servers in a full
// mesh, N/3 nodes each: a server takes in its nodes' batches and the
// other two servers' (N·B in all) and delivers every batch to its N/3
// nodes, its own nodes' batches also to the two routes: cores = a·N·B +
// b·N·B·(N/3 + 2/3).
func saturation(sh scaleShape, c NATSCapacity) []ScaleSaturation {
	a, b := c.PerPublishUS/1e6, c.PerDeliveryUS/1e6
	cases := []struct {
		name  string
		batch func(n int) (batches, msgB float64)
	}{
		{"hot load (20,000 hits/s over 100 keys, 200/s per key, limit 250/s)", func(n int) (float64, float64) {
			p := predictScale(sh, designNow, n, "hot", hotRate, 0)
			return p.BatchesPS, (p.OutB / (1000 / hotRate)) / math.Max(p.BatchesPS, 1e-9)
		}},
		{"hot keys, the load growing with the cluster (" + strconv.Itoa(int(math.Round(hotRate/30))) + " hits/s per node, as at 30 nodes; 100 keys, each at 80% of its limit)", func(n int) (float64, float64) {
			shape := sh
			rate := hotRate / 30 * float64(n)
			shape.HotLimit = sh.HotLimit / hotRate * rate // each key still at 80% of its limit
			p := predictScale(shape, designNow, n, "hot", rate, 0)
			return p.BatchesPS, (p.OutB / (1000 / rate)) / math.Max(p.BatchesPS, 1e-9)
		}},
		{"every batch slot used (1 tick + 1 early batch per gap: " + strconv.Itoa(int(1/sh.SyncS+1/sh.EarlyGapS)) + "/s per node)", func(n int) (float64, float64) {
			return 1/sh.SyncS + 1/sh.EarlyGapS, messageBytes(sh, n, time.Second, 1) + entryBytes(10, 1)
		}},
	}
	var out []ScaleSaturation
	for _, cs := range cases {
		s := ScaleSaturation{Case: cs.name}
		for n := 2; n <= maxSaturationNodes; n++ {
			bps, mb := cs.batch(n)
			nf := float64(n)
			if s.OneServer == 0 && a*nf*bps+b*nf*(nf-1)*bps >= 1 {
				s.OneServer = n
				s.BatchesPS = round(bps, 2)
				s.MessageB = round1(mb)
				s.DeliveriesPS = round(nf*(nf-1)*bps, 0)
				s.BytesPS = round(s.DeliveriesPS*mb, 0)
			}
			if s.ThreeServers == 0 && a*nf*bps+b*nf*bps*(nf/3+2.0/3) >= 1 {
				s.ThreeServers = n
			}
			if s.OneServer > 0 && s.ThreeServers > 0 {
				break
			}
		}
		out = append(out, s)
	}
	return out
}

// throughOrigin fits y ≈ b·x.
func throughOrigin(xs, ys []float64) float64 {
	var sxx, sxy float64
	for i, x := range xs {
		sxx, sxy = sxx+x*x, sxy+x*ys[i]
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}
