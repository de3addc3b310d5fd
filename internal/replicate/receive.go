package replicate

import (
	"errors"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// receiver reads peers' batches and merges them into the store. NATS calls
// onBatch for one message at a time (one subscription), so rx and rxBuf
// need no lock; the syncer merges replies through merge as well, from its
// own goroutine, which is why the deferred counts are behind deferMu.
type receiver struct {
	*shared

	rx    message
	rxBuf rxBuffers

	// Counts for now's window + 1 that the store could not take yet.
	deferMu  sync.Mutex
	deferred []deferredCount
}

type deferredCount struct {
	peer counter.PeerID
	wc   counter.WindowCount
}

// rxBuffers are the scratch buffers of one receiving goroutine.
type rxBuffers struct {
	plain, ad []byte
}

func newReceiver(sh *shared) *receiver {
	return &receiver{shared: sh}
}

// onBatch merges a peer's batch.
func (rv *receiver) onBatch(msg *nats.Msg) {
	now := rv.now()
	m := &rv.rx
	if !rv.read(msg.Data, m, kindBatch, &rv.rxBuf, now) {
		return
	}
	p := rv.peers.get(m.Node, m.Incarnation, now, true)
	if p == nil {
		rv.m.peersRefused.Inc()
		rv.m.dropped.unknownPeer.Add(float64(len(m.Entries)))
		return
	}
	rv.observe(p, m, now)
	rv.merge(m, func(int) counter.PeerID { return p.id }, now)
	rv.m.batchesReceived.Inc() // after merging: tests wait on it
}

// read opens (with a cluster key) and decodes data into m, and checks it
// is of kind, not from this process and sent close to now; it counts and
// reports false for anything else. Nothing of a message that fails here
// is used, logged or kept.
func (s *shared) read(data []byte, m *message, kind msgKind, buf *rxBuffers, now time.Time) bool {
	if len(data) > s.cfg.MaxMessageBytes {
		s.m.malformed.oversize.Inc()
		return false
	}
	if s.seal != nil {
		plain, err := s.seal.open(buf.plain[:0], data, kind, &buf.ad)
		switch {
		case err == nil:
			buf.plain, data = plain, plain
		case errors.Is(err, errUnsealed):
			s.m.malformed.unsealed.Inc()
			return false
		case errors.Is(err, errUnknownKey):
			s.m.malformed.unknownKey.Inc()
			return false
		case errors.Is(err, errVersion):
			s.m.malformed.version.Inc()
			return false
		default:
			s.m.malformed.auth.Inc()
			return false
		}
	} else if isSealed(data) {
		s.m.malformed.noKey.Inc()
		return false
	}
	if err := decode(data, m); err != nil {
		if errors.Is(err, errVersion) {
			s.m.malformed.version.Inc()
		} else {
			s.m.malformed.decode.Inc()
		}
		s.log.Debug("dropped a malformed message", "err", err) // %q-quoted: safe to print
		return false
	}
	if m.Kind != kind {
		s.m.malformed.kind.Inc()
		return false
	}
	if m.Node == s.self.Node && m.Incarnation == s.self.Incarnation {
		s.m.malformed.self.Inc()
		return false
	}
	if d := now.UnixMilli() - m.SentAtMS; d > s.cfg.MaxClockSkew.Milliseconds() || d < -s.cfg.MaxClockSkew.Milliseconds() {
		s.m.malformed.clock.Inc()
		return false
	}
	return true
}

// clockPeriod is how long, in heartbeats, a peer's batches are watched
// to tell its clock skew from the delays of their delivery.
const clockPeriod = 10

// noAge marks a clock period without batches.
const noAge = math.MaxInt64

// observe updates the peer's sequence, delivery and clock figures from a
// batch.
//
// A batch's age, receive time minus send time, is the clock skew plus its
// delivery delay. The delay is never negative but has no bound: batches
// wait while this node, NATS or the peer is stalled (a GC pause, CPU
// starvation, SIGSTOP) or while this node reads slowly, and a node that
// resumes reads them seconds old. So the least age of the peer's batches
// over the current and the previous clock period (at least ten
// heartbeats: some batch comes promptly unless a stall or a backlog lasts
// that long) is the skew plus the least delivery delay (which the link
// probes tell: peer.skew), and what a batch's age exceeds it by is the
// time the batch waited. Each is logged under its own name, at most once
// a minute per peer: a skew above SkewWarning at the end of a period, a
// wait above it at once.
func (rv *receiver) observe(p *peer, m *message, now time.Time) {
	switch {
	case !p.haveSeq || m.Seq == p.lastSeq+1:
	case m.Seq > p.lastSeq:
		rv.m.batchesMissed.Add(float64(min(m.Seq-p.lastSeq-1, 1<<20)))
	default:
		rv.m.batchesRepeated.Inc()
	}
	if !p.haveSeq || m.Seq > p.lastSeq {
		p.lastSeq, p.haveSeq = m.Seq, true
	}
	age := now.UnixMilli() - m.SentAtMS
	p.ageMS.Store(age)
	if ended, start := p.ages.roll(now, clockPeriod*rv.cfg.Heartbeat); ended {
		if skew := p.skew(); p.ages.prevMin != noAge && abs(skew) > rv.cfg.SkewWarning.Milliseconds() && now.Sub(p.skewLogged) >= time.Minute {
			p.skewLogged = now
			// The node id is validated printable ASCII, from an authenticated message.
			rv.log.Warn("peer clock skew above the warning threshold; windows may disagree at their edges",
				"peer", p.key.String(), "skew", msDuration(skew).String(), "threshold", rv.cfg.SkewWarning.String(),
				"period", now.Sub(start).Round(time.Millisecond).String())
		}
	}
	least := p.ages.least()
	if waited := age - least; least != noAge && waited > rv.cfg.SkewWarning.Milliseconds() && now.Sub(p.lateLogged) >= time.Minute {
		p.lateLogged = now
		rv.log.Warn("a peer's batch waited above the warning threshold before it was read (this node, NATS or the peer stalled); its counts arrived that late",
			"peer", p.key.String(), "waited", msDuration(waited).String(), "threshold", rv.cfg.SkewWarning.String())
	}
	p.ages.note(age)
	p.minAgeMS.Store(p.ages.least())
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// merge merges m's entries, each under the peer id peerOf gives for its
// origin index (counter.Self: skip the entry, it is this node's own).
// Entries of a bucket this node does not know, of a window length no limit
// of the bucket has here, or of another algorithm, are dropped and counted
// by reason; counts above what a limit of the bucket allows are merged at
// that bound. The configuration is loaded once for the whole message.
func (rv *receiver) merge(m *message, peerOf func(int) counter.PeerID, now time.Time) (merged int) {
	rv.m.entriesReceived.Add(float64(len(m.Entries)))
	var idxBuf [16]int64
	var boundBuf [16]int64
	idx, bound := idxBuf[:0], boundBuf[:0]
	tab := rv.tab.Load()
	for _, l := range m.Limits {
		i, ok := tab.idx[l.Name]
		if !ok {
			idx, bound = append(idx, -1), append(bound, 0)
			continue
		}
		bk := &tab.buckets[i]
		if bk.Algorithm != l.Algorithm {
			idx, bound = append(idx, -3), append(bound, 0)
			continue
		}
		mx := int64(counter.MaxCount)
		if bk.Bounds != nil {
			var valid bool
			if mx, valid = bk.Bounds[l.ScaleMS]; !valid {
				idx, bound = append(idx, -2), append(bound, 0)
				continue
			}
		}
		idx, bound = append(idx, int64(bk.ID)), append(bound, mx)
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		b := idx[e.Limit]
		switch b {
		case -1:
			rv.m.dropped.unknownBucket.Inc()
			continue
		case -2:
			rv.m.dropped.scale.Inc()
			continue
		case -3:
			rv.m.dropped.algorithm.Inc()
			continue
		}
		pid := peerOf(e.Origin)
		if pid == counter.Self {
			continue
		}
		l := &m.Limits[e.Limit]
		count := e.Count
		if count > bound[e.Limit] {
			count = bound[e.Limit]
			rv.m.clamped.Inc()
		}
		wc := counter.WindowCount{Bucket: counter.Bucket(b), Key: e.Key, ScaleMS: l.ScaleMS, Algorithm: l.Algorithm, Window: e.Window, Count: count}
		if rv.mergeOne(pid, wc, now) {
			merged++
		}
	}
	return merged
}

func (rv *receiver) mergeOne(pid counter.PeerID, wc counter.WindowCount, now time.Time) bool {
	switch st := rv.store.Merge(pid, wc, now); st {
	case counter.Merged:
		rv.m.entriesMerged.Inc()
		return true
	case counter.Unchanged:
	case counter.Stale:
		rv.m.dropped.stale.Inc()
	case counter.Deferred:
		rv.deferMu.Lock()
		if len(rv.deferred) < maxPending {
			rv.deferred = append(rv.deferred, deferredCount{pid, wc})
		} else {
			rv.m.dropped.deferred.Inc()
		}
		rv.deferMu.Unlock()
	case counter.Mismatch:
		rv.m.dropped.mismatch.Inc()
	case counter.Refused:
		rv.m.dropped.refused.Inc()
	default:
		rv.m.dropped.invalid.Inc()
	}
	return false
}

// retryDeferred offers the deferred counts again.
func (rv *receiver) retryDeferred(now time.Time) {
	rv.deferMu.Lock()
	d := rv.deferred
	rv.deferred = nil
	rv.deferMu.Unlock()
	for _, x := range d {
		rv.mergeOne(x.peer, x.wc, now) // a still-deferred count is deferred again
	}
}
