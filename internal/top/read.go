package top

import (
	"cmp"
	"slices"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// Key is one listed key of a period: it had at most Hits and at least
// Hits − Error hits.
type Key struct {
	Key   string `json:"key"`
	Hits  uint64 `json:"hits"`
	Error uint64 `json:"error"`
}

// Period is a bucket's hits over [Start, End]: the exact totals, the top
// keys by outcome, and a bound on the hits of any key not listed.
type Period struct {
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Admitted uint64    `json:"admitted"`
	Denied   uint64    `json:"denied"`
	// UnlistedAdmitted and UnlistedDenied: no key missing from
	// TopAdmitted (TopDenied) had more admitted (denied) hits. Each is at
	// most Admitted/K (Denied/K).
	UnlistedAdmitted uint64 `json:"unlisted_admitted"`
	UnlistedDenied   uint64 `json:"unlisted_denied"`
	TopAdmitted      []Key  `json:"top_admitted"`
	TopDenied        []Key  `json:"top_denied"`
}

// Count is a number of admitted and denied hits.
type Count struct {
	Admitted uint64 `json:"admitted"`
	Denied   uint64 `json:"denied"`
}

// Tops is what a Sketch knows of one bucket at one instant.
type Tops struct {
	// Minute is the last minute: the current epoch and the Epochs−1
	// before it.
	Minute Period `json:"minute"`
	// Window is the bucket's window holding the read's instant; nil when
	// no hit was counted in it.
	Window *Period `json:"window,omitempty"`
	// Epochs are the minute's totals per epoch of EpochMS, oldest first.
	Epochs []Count `json:"epochs"`
}

// snap is a copy of one summary taken under its shard's lock.
type snap struct {
	total   uint64
	min     uint64
	entries []snapEntry
}

type snapEntry struct {
	key        string
	count, err uint64
}

func (s *Sketch) snapshot(sm *summary) snap {
	out := snap{total: sm.total, min: sm.min(), entries: make([]snapEntry, sm.n)}
	for i := range sm.n {
		out.entries[i] = snapEntry{key: string(sm.key(i, s.maxKey)), count: sm.count[i], err: sm.err[i]}
	}
	return out
}

// Read returns bucket's tops at now, at most n keys per list (n ≤ 0:
// every key the summaries hold). A nil Sketch or a bucket out of range
// reads empty.
func (s *Sketch) Read(bucket counter.Bucket, now time.Time, n int) Tops {
	ms := now.UnixMilli()
	cur := counter.WindowOf(ms, EpochMS)
	t := Tops{
		Minute: Period{Start: time.UnixMilli((cur - Epochs + 1) * EpochMS).UTC(), End: now.UTC()},
		Epochs: make([]Count, Epochs),
	}
	if s == nil {
		t.Minute.TopAdmitted, t.Minute.TopDenied = []Key{}, []Key{}
		return t
	}
	var minute, window [2][]snap
	winStart, winScale := int64(0), int64(0)
	type winSnap struct {
		start, scale int64
		s            [2]snap
	}
	var wins []winSnap
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if bs := sh.b[bucket]; bs != nil {
			for j := range bs.ep {
				e := bs.epoch[j]
				if e > cur || e <= cur-Epochs {
					continue
				}
				for o := range 2 {
					minute[o] = append(minute[o], s.snapshot(&bs.ep[j][o]))
				}
				c := &t.Epochs[e-(cur-Epochs+1)]
				c.Admitted = satAdd(c.Admitted, bs.ep[j][0].total)
				c.Denied = satAdd(c.Denied, bs.ep[j][1].total)
			}
			if bs.winScale > 0 && bs.winStart <= ms && ms < bs.winStart+bs.winScale {
				wins = append(wins, winSnap{bs.winStart, bs.winScale, [2]snap{s.snapshot(&bs.win[0]), s.snapshot(&bs.win[1])}})
				if bs.winStart > winStart || winScale == 0 {
					winStart, winScale = bs.winStart, bs.winScale
				}
			}
		}
		sh.mu.Unlock()
	}
	t.Minute.fill(minute, n)
	if winScale > 0 {
		for _, w := range wins {
			if w.start == winStart && w.scale == winScale {
				window[0], window[1] = append(window[0], w.s[0]), append(window[1], w.s[1])
			}
		}
		p := &Period{Start: time.UnixMilli(winStart).UTC(), End: now.UTC()}
		p.fill(window, n)
		t.Window = p
	}
	return t
}

// fill sets p's totals, bounds and lists from summaries by outcome.
func (p *Period) fill(sums [2][]snap, n int) {
	p.Admitted, p.UnlistedAdmitted, p.TopAdmitted = merge(sums[0], n)
	p.Denied, p.UnlistedDenied, p.TopDenied = merge(sums[1], n)
}

// merge combines summaries of disjoint parts of one stream (shards,
// epochs, nodes): a key's upper bound is its count where listed plus the
// smallest count of each summary that does not list it; its lower bound is
// count − err where listed. unlisted is the sum of the smallest counts,
// the upper bound of any key no summary lists. It returns the total hits,
// that bound and the top n keys by upper bound (n ≤ 0: all).
func merge(sums []snap, n int) (total, unlisted uint64, top []Key) {
	type acc struct {
		hi, lo, mins uint64 // mins: the smallest counts of the summaries that list the key
	}
	cands := map[string]*acc{}
	for _, sm := range sums {
		total = satAdd(total, sm.total)
		unlisted = satAdd(unlisted, sm.min)
		for _, e := range sm.entries {
			a := cands[e.key]
			if a == nil {
				a = &acc{}
				cands[e.key] = a
			}
			a.hi = satAdd(a.hi, e.count)
			a.lo = satAdd(a.lo, e.count-e.err)
			a.mins = satAdd(a.mins, sm.min)
		}
	}
	top = make([]Key, 0, len(cands))
	for k, a := range cands {
		hi := satAdd(a.hi, unlisted-min(a.mins, unlisted))
		top = append(top, Key{Key: k, Hits: hi, Error: hi - min(a.lo, hi)})
	}
	slices.SortFunc(top, func(a, b Key) int {
		return cmp.Or(cmp.Compare(b.Hits, a.Hits), cmp.Compare(a.Error, b.Error), cmp.Compare(a.Key, b.Key))
	})
	if n > 0 && len(top) > n {
		top = top[:n]
	}
	return total, unlisted, top
}

// Merge combines what disjoint streams know of one bucket — the nodes of
// a cluster, each read with at most n keys per list (n ≤ 0: every key) —
// by the rule of merge: a key's Hits adds, for each part that does not
// list it, that part's bound on unlisted keys. A list cut at n keys may
// have left out keys with up to its last key's hits, so that part's bound
// is at least those. The merged window is the parts' latest one; the
// epochs add up by position.
func Merge(parts []Tops, n int) Tops {
	var out Tops
	var minute, window [2][]snap
	var ws []*Period
	for i, p := range parts {
		if i == 0 || p.Minute.Start.Before(out.Minute.Start) {
			out.Minute.Start = p.Minute.Start
		}
		out.Minute.End = maxTime(out.Minute.End, p.Minute.End)
		addPeriod(&minute, p.Minute, n)
		if p.Window != nil && (len(ws) == 0 || !p.Window.Start.Before(ws[0].Start)) {
			if len(ws) > 0 && p.Window.Start.After(ws[0].Start) {
				ws = ws[:0]
			}
			ws = append(ws, p.Window)
		}
		for j, c := range p.Epochs {
			if j >= len(out.Epochs) {
				out.Epochs = append(out.Epochs, Count{})
			}
			out.Epochs[j].Admitted = satAdd(out.Epochs[j].Admitted, c.Admitted)
			out.Epochs[j].Denied = satAdd(out.Epochs[j].Denied, c.Denied)
		}
	}
	out.Minute.fill(minute, n)
	if len(ws) > 0 {
		w := &Period{Start: ws[0].Start}
		for _, p := range ws {
			w.End = maxTime(w.End, p.End)
			addPeriod(&window, *p, n)
		}
		w.fill(window, n)
		out.Window = w
	}
	return out
}

// addPeriod appends p's lists to sums as summaries of one part.
func addPeriod(sums *[2][]snap, p Period, n int) {
	for o, l := range [2]struct {
		total, unlisted uint64
		keys            []Key
	}{{p.Admitted, p.UnlistedAdmitted, p.TopAdmitted}, {p.Denied, p.UnlistedDenied, p.TopDenied}} {
		sm := snap{total: l.total, min: l.unlisted, entries: make([]snapEntry, len(l.keys))}
		for i, k := range l.keys {
			sm.entries[i] = snapEntry{key: k.Key, count: k.Hits, err: min(k.Error, k.Hits)}
		}
		if n > 0 && len(l.keys) >= n {
			sm.min = max(sm.min, l.keys[len(l.keys)-1].Hits)
		}
		sums[o] = append(sums[o], sm)
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
