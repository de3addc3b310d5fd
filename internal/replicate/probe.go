package replicate

import (
	"context"
	"encoding/binary"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Link probes. At every tick a node asks its peers, on the query subject,
// to echo a probe at once; the time until a peer's echo comes back is the
// round trip through NATS to that peer and back, read on one clock. It
// gives the share delay its input without the clock skew (see
// share.Delay), however long the delay grows, and as soon as it grows:
// a probe that is not echoed in time is a round trip at least that long.
// And half the least round trip is the delivery delay that a batch's age
// holds besides the clock skew, so clock_skew_seconds reports the clocks
// alone.
//
// A probe is a query whose body is probeMarker and the prober's send time
// (8 bytes, nanoseconds since its epoch, on its monotonic clock); the
// echo is an answer with the same body. A peer of an older release hands
// a probe to its Answerer, whose answer is not an echo and is ignored:
// its delay is then read from its batches' ages (peer.oneWay).

// probeMarker starts a probe's body; no query of an Answerer does (they
// are JSON).
const probeMarker = "\x00probe"

// probeBodyLen is a probe's body length.
const probeBodyLen = len(probeMarker) + 8

// probesPerPeer bounds the probes a node echoes: this many per peer
// table slot and sync interval, so that every peer's probe is echoed and a
// flood of probes costs little.
const probesPerPeer = 2

// probeGrace is how long a peer first heard from is waited for to echo
// a probe before it is taken as one of an older release, which echoes
// none.
const probeGrace = 5 * time.Second

// probeRing is how many of its latest probes a node remembers the send
// times of, to time the ones not yet echoed.
const probeRing = 64

// isProbe reports whether a query's body is a probe.
func isProbe(body string) bool {
	return len(body) == probeBodyLen && strings.HasPrefix(body, probeMarker)
}

// prober sends probes and reads their echoes. rx and buf are owned by the
// echo subscription's handler (one message at a time); epoch is set
// before Run; sent is under mu.
type prober struct {
	epoch time.Time // the monotonic clock probes are timed on
	rx    message
	buf   rxBuffers

	mu    sync.Mutex
	sent  [probeRing]time.Duration // send times since epoch, a ring
	nsent uint64
}

// note records a probe sent at d since epoch.
func (pr *prober) note(d time.Duration) {
	pr.mu.Lock()
	pr.sent[pr.nsent%probeRing] = d
	pr.nsent++
	pr.mu.Unlock()
}

// waiting is how long, in ms at now, the oldest probe sent after the one
// echoed last (sent at echoed since epoch) has waited for its echo: 0
// when none waits. Probes beyond the ring count from its oldest.
func (pr *prober) waiting(echoed time.Duration, now time.Time) int64 {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	oldest := time.Duration(-1)
	for i := range min(pr.nsent, probeRing) {
		if d := pr.sent[i]; d > echoed && (oldest < 0 || d < oldest) {
			oldest = d
		}
	}
	if oldest < 0 {
		return 0
	}
	return max(0, (now.Sub(pr.epoch) - oldest).Milliseconds())
}

// probeLoop sends a probe at every sync interval while the link is up
// and some peer is known,
// until ctx is done; the echoes come to inbox. It runs on its own
// goroutine: a publish that waits on a stalled link delays the next
// probe, nothing else.
func (r *Replicator) probeLoop(ctx context.Context, nc *nats.Conn, inbox string) {
	t := time.NewTicker(r.cfg.SyncInterval)
	defer t.Stop()
	var sealBuf, sealAD []byte
	body := make([]byte, probeBodyLen)
	copy(body, probeMarker)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.connected() || r.peers.len() == 0 {
			continue // nobody to time
		}
		at := time.Since(r.probe.epoch)
		binary.LittleEndian.PutUint64(body[len(probeMarker):], uint64(at))
		r.probe.note(at)
		m := message{header: header{Kind: kindQuery, Node: r.self.Node, Incarnation: r.self.Incarnation, SentAtMS: r.now().UnixMilli()}, Body: string(body)}
		data := r.sealed(&sealBuf, &sealAD, m.encode(nil), kindQuery)
		if err := nc.PublishMsg(&nats.Msg{Subject: r.querySubj, Reply: inbox, Data: data}); err != nil {
			r.log.Debug("send a link probe", "err", err)
		}
	}
}

// onEcho reads a peer's echo of a probe: the round trip to that peer.
func (r *Replicator) onEcho(msg *nats.Msg) {
	pr := &r.probe
	now := r.now()
	if !r.read(msg.Data, &pr.rx, kindAnswer, &pr.buf, now) || !isProbe(pr.rx.Body) {
		return
	}
	sent := time.Duration(binary.LittleEndian.Uint64([]byte(pr.rx.Body[len(probeMarker):])))
	rtt := time.Since(pr.epoch) - sent
	if sent < 0 || rtt < 0 || rtt > r.cfg.MaxClockSkew {
		return // not one of this process's probes, or an echo of long ago
	}
	// An echo is a sign of life of a peer known from its batches; it adds
	// none to the table.
	p := r.peers.heardFrom(pr.rx.Node, pr.rx.Incarnation, now)
	if p == nil {
		return
	}
	p.roundTrip(sent, rtt.Milliseconds(), now, clockPeriod*r.cfg.Heartbeat)
}

// link is what probes tell of one peer: the round trip to it, latest,
// least and longest lately, and which probe it echoed last. Written by
// the echo handler only.
type link struct {
	rttMS    atomic.Int64 // latest round trip; noAge before the first echo
	rttMinMS atomic.Int64 // least round trip over this period and the previous; noAge: none
	rttMaxMS atomic.Int64 // longest likewise
	echoed   atomic.Int64 // send time since the prober's epoch of the latest probe echoed, ns

	rtts lately
}

// roundTrip notes the echo of the probe sent at sent: a round trip of ms
// at now; periods of length period.
func (l *link) roundTrip(sent time.Duration, ms int64, now time.Time, period time.Duration) {
	l.rtts.roll(now, period)
	l.rtts.note(ms)
	l.rttMinMS.Store(l.rtts.least())
	l.rttMaxMS.Store(l.rtts.most())
	l.rttMS.Store(ms)
	if int64(sent) > l.echoed.Load() {
		l.echoed.Store(int64(sent))
	}
}
