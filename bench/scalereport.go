package main

import (
	"fmt"
	"strings"
)

// targetScaleFlood is the budget-shares target: a flood of keys hit once
// costs each node at most this share of the replication bytes it cost
// before.
const targetScaleFlood = 0.01

// scaleTarget judges the flood's in-bytes per node, after over before, at
// every node count.
func scaleTarget(res *Results) Target {
	t := Target{Name: "scale-flood", Goal: "a flood of keys hit once costs each node ≤ 1% of the replication bytes it cost before budget shares (in-bytes per node per 1k hits, after/before, 3, 10 and 30 nodes)"}
	s := res.Scale
	if s == nil {
		return t
	}
	if s.Before == nil || s.Before.Error != "" {
		if s.Before != nil {
			t.Measured = "no baseline: " + s.Before.Error
		}
		return t
	}
	var parts []string
	worst, n := 0.0, 0
	for _, row := range s.Rows {
		if row.Load != "flood" || row.Before == nil || row.After == nil || row.Before.value(mInB) <= 0 {
			continue
		}
		n++
		worst = max(worst, row.InBRatio)
		parts = append(parts, fmt.Sprintf("%d nodes %.4f× (%.0f → %.0f B)", row.Nodes, row.InBRatio, row.Before.value(mInB), row.After.value(mInB)))
	}
	if n == 0 {
		return t
	}
	t.Value = worst
	t.Measured = strings.Join(parts, ", ") + "; before " + shortRef(s.Before)
	t.Met = ptr(worst <= targetScaleFlood)
	if !*t.Met {
		t.Margin = fmt.Sprintf("%.3f× against 0.01×", worst)
	}
	return t
}

func shortRef(t *ScaleTree) string {
	if t == nil {
		return "—"
	}
	if t.Commit != "" {
		return t.Commit[:min(len(t.Commit), 12)]
	}
	return t.Ref
}

// writeScale writes the scale scenario's section.
func writeScale(b *md, res *Results, s *Scale) {
	b.f("## Replication at scale: 3, 10 and 30 nodes on one NATS\n\n")
	b.f("`%s`: N nodes in one process, each with its own NATS connection, on one nats-server process; %d hits per node count and load, spread evenly over the nodes. **hot**: 100 keys, each node going round all of them, at a steady 20,000 hits/s of the whole cluster (200/s per key) against 250 per 1 s window, so every hit is admitted and each key spends the end of every window past half its limit. **flood**: each hit on a key never seen before, as fast as the nodes go, against 100 per 60 s (a per-client-IP limit). Figures are per node, after every batch was received; *per 1k hits* is per thousand hits of the whole cluster. A batch reaches every other node, so in-bytes are out-bytes × (N−1). CPU per hit is the whole process's (the nodes and the load; nats-server runs apart). The model (docs/replication-scale.md, `bench/scalemodel.go`) is computed from the wire format, the publishing rules and the load's shape, not from these figures (the flood's measured rate sets only how many ticks it spans); only its CPU column is fitted to them.\n\n",
		s.Command, s.Benchtime)
	trees := []*ScaleTree{s.Before, s.After}
	for _, t := range trees {
		if t == nil {
			continue
		}
		switch {
		case t.Error != "":
			b.f("- **%s** (%s): not measured: %s\n", t.Tree, t.Ref, t.Error)
		case t.Tree == "before":
			b.f("- **before**: `%s` (`--shares-baseline-ref %s`) with this tree's `%s`, %.0fs; its model is the current design's.\n", t.Commit, t.Ref, scaleBenchFile, t.Seconds)
		default:
			b.f("- **after**: this tree, %.0fs; its model is budget shares' (only keys near their share are sent: hot keys at most as today, an upper bound; a flood nothing but heartbeats).\n", t.Seconds)
		}
	}
	b.f("\nEach cell: measured (model).\n\n")
	b.f("| load | nodes | tree | out-B/1k hits | in-B/1k hits | in-msgs/1k hits | merged/1k hits | in-B/node/s | CPU µs/hit (fit) | hits/s | anti-entropy entries/1k hits | sync-B/1k hits | slow-consumer events |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range s.Rows {
		for _, x := range []struct {
			tree  string
			m     *ScaleMetrics
			model ScalePrediction
		}{{"before", row.Before, row.Model}, {"after", row.After, row.ModelShares}} {
			if x.m == nil {
				continue
			}
			b.f("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.0f | %.2f | %.0f | %.0f |\n", row.Load, row.Nodes, x.tree,
				cell(x.m.value(mOutB), x.model.OutB, 0), cell(x.m.value(mInB), x.model.InB, 0), cell(x.m.value(mInMsgs), x.model.InMsgs, 2),
				cell(x.m.value(mMerged), x.model.Merged, 1), cell(x.m.value(mInBs), x.model.InBPS, 0), cpuCell(x.m.value(mCPU), x.model.CPUUS, row.Load == "flood" && s.CPU != nil),
				x.m.value(mHits), x.m.value(mAE), x.m.value(mSyncB), x.m.value(mSlow))
		}
	}
	b.f("\nThe flood's per-second figures are over a burst of well under a second: its per-hit figures are the ones to read. *sync-B* is sync replies (warm starts and the resyncs that follow a slow-consumer event or a reconnection), each to one requester, and not in the other columns; a flood row that merged fewer than (N−1)/N × 1000 entries per 1k hits received entries that raised nothing (a sync reply had brought them first, or the minute ended before they arrived). A node's first anti-entropy round starts one period (10 s) after it started, so only a measurement that reached it shows anti-entropy entries (counted in out-B, in-B and merged too); the model leaves them out. The hot rows depend on when each node's goroutines get a CPU: on a loaded machine early batches go out later and fewer, and two runs of the same code differ most at 30 nodes.\n\n")
	if c := s.CPU; c != nil {
		b.f("CPU model (the *fit* column), fitted to the %s tree's flood rows, whose work is almost all entries: CPU per hit = %.2f µs + %.3f µs × entries merged per hit over the whole cluster (worst residual %.0f%%). It is what a merged entry that creates its key costs this process, receiving and decoding included, with NATS and other work on the same cores. A hot entry updates a key that exists and comes with many small messages: the fit is not applied to the hot rows.\n\n",
			c.Tree, c.BaseUS, c.PerEntryUS, 100*c.WorstResidual)
	}
	if s.Before != nil && s.Before.Error == "" {
		b.f("After over before, same run:\n\n| load | nodes | in-B | in-msgs | merged | CPU per hit |\n|---|---:|---:|---:|---:|---:|\n")
		for _, row := range s.Rows {
			if row.Before == nil || row.After == nil {
				continue
			}
			b.f("| %s | %d | **%s** | %s | %s | %s |\n", row.Load, row.Nodes, ratio(row.After.value(mInB), row.Before.value(mInB)),
				ratio(row.After.value(mInMsgs), row.Before.value(mInMsgs)), ratio(row.After.value(mMerged), row.Before.value(mMerged)),
				ratio(row.After.value(mCPU), row.Before.value(mCPU)))
		}
		b.f("\nTarget: the flood rows' in-B ratio ≤ %.2f at every node count.\n\n", targetScaleFlood)
	}
	writeScaleSaturation(b, s)
}

// writeScaleSaturation writes what one nats-server did and the node
// counts at which the model says it saturates.
func writeScaleSaturation(b *md, s *Scale) {
	c := s.NATS
	if c == nil || len(c.Runs) == 0 {
		return
	}
	b.f("### When does NATS saturate?\n\n")
	b.f("One nats-server process on this machine, one publisher connection flushing every 256 messages, each subscriber on its own connection, all in the runner's process on the same cores (so the server had at most what they left it). Server CPU from /proc over the measured seconds, after half a second of warm-up.\n\n")
	b.f("| fan-out | message | published/s | delivered/s | delivered MB/s | server CPU (cores) | server µs per delivery | dropped |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range c.Runs {
		b.f("| %d | %d B | %.0f | %.0f | %.1f | %.2f | %.3f | %d |\n", r.Fanout, r.Size, r.PublishedPS, r.DeliveredPS, r.DeliveredBS/1e6, r.ServerCPU, r.PerDeliveryUS, r.Dropped)
	}
	b.f("\nFrom the two small-message runs (cores = a × published/s + b × delivered/s): **a = %.3f µs per message published, b = %.3f µs per message delivered** of server CPU.\n\n", c.PerPublishUS, c.PerDeliveryUS)
	if len(s.Saturation) == 0 {
		return
	}
	b.f("Every batch goes to the server once and out to the N−1 other nodes, so one server needs cores = a·N·B + b·N·(N−1)·B for B batches per node per second. In a three-server full mesh with N/3 nodes on each, a server takes in N·B batches (its nodes' and the two routes') and delivers each to its N/3 nodes, its own nodes' also to the two routes: a·N·B + b·N·B·(N/3 + 2/3). The node count at which that reaches one core:\n\n")
	b.f("| batches | B per node/s at that N | batch size | one server: N | deliveries/s | MB/s out | three servers: N |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range s.Saturation {
		b.f("| %s | %.1f | %.0f B | %s | %.0f | %.1f | %s |\n", x.Case, x.BatchesPS, x.MessageB, satN(x.OneServer), x.DeliveriesPS, x.BytesPS/1e6, satN(x.ThreeServers))
	}
	b.f("\nWith k cores for the server, N grows about as √k (deliveries grow as N²). The per-node batch rate, not the keys, sets it: budget shares send a hot key's batches at most as today, so these figures hold for both designs; they remove the flood's.\n\n")
}

func satN(n int) string {
	if n == 0 {
		return fmt.Sprintf("> %d", maxSaturationNodes)
	}
	return fmt.Sprint(n)
}

// cell is "measured (model)".
func cell(measured, model float64, digits int) string {
	return fmt.Sprintf("%.*f (%.*f)", digits, measured, digits, model)
}

// cpuCell is "measured (model)", or "measured (—)" without a model.
func cpuCell(measured, model float64, modelled bool) string {
	if !modelled {
		return fmt.Sprintf("%.2f (—)", measured)
	}
	return cell(measured, model, 2)
}

// ratio is a/b, or — when b is 0.
func ratio(a, b float64) string {
	if b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.4f", a/b)
}

// writeScaleMissed explains a missed flood target from the figures.
func writeScaleMissed(b *md, res *Results, t Target) {
	b.f("- **A flood's replication** (%s). ", t.Margin)
	for _, row := range res.Scale.Rows {
		if row.Load == "flood" && row.After != nil {
			b.f("At %d nodes each node still received %.0f entries (%.0f B) per 1k hits: every flood key is sent once, by the node that took it, to all the others, (N−1)/N × 1000 entries of %.1f B each. ",
				row.Nodes, row.After.value(mMerged), row.After.value(mInB), row.Model.EntryB)
			break
		}
	}
	b.f("Only a rule that sends keys near their share, not every changed key, removes that cost.\n")
}
