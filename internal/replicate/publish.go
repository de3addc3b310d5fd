package replicate

import (
	"errors"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// publisher turns this node's changed counts into batch messages: the
// changes since the previous batch, those of a publish that failed, a
// share of the anti-entropy counts, or a heartbeat when there is nothing
// else. Its methods are called by one goroutine (Run's loop) at a time;
// mu is held for a whole publish, and by pending.
type publisher struct {
	*shared

	// mu is held for a whole publish, and by the pending_entries gauge:
	// changes taken out of the store but not yet sent still count as
	// pending, so "0 pending" means "all sent".
	mu      sync.Mutex
	split   *splitter
	seq     uint64                // the next batch's number
	changes []counter.WindowCount // scratch: this publish's counts
	retry   []counter.WindowCount // counts of a publish that failed
	// lastTab is the bucket table retry and aeQueue were filled under:
	// their ids are read under it, since a reload may give an id of a
	// removed bucket to another one.
	lastTab *table
	sealBuf []byte // scratch: the sealed message
	sealAD  []byte // scratch: its additional data
	// lastSent is the time of the last batch or heartbeat.
	lastSent time.Time

	// Anti-entropy: a snapshot of this node's live counts, re-sent a
	// share per tick.
	aeQueue []counter.WindowCount
	aeNext  time.Time // when the next snapshot may be taken
	aeShare int       // counts per tick
}

func newPublisher(sh *shared) *publisher {
	return &publisher{shared: sh, split: newSplitter(sh.cfg.MaxMessageBytes, nil)}
}

// pending is how many keys have changes not yet published.
func (p *publisher) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.store.Pending()
}

// publishTick is the publishing half of a tick: changes plus a share of
// the anti-entropy counts, or a heartbeat when there is nothing to send.
func (p *publisher) publishTick(now time.Time, max int, send func([]byte) error) {
	if p.publishChanges(now, max, send, true) == 0 && now.Sub(p.lastSent) >= p.cfg.Heartbeat {
		p.heartbeat(now, max, send)
	}
}

// heartbeat publishes an empty batch: peers keep this node known while it
// has nothing to say.
func (p *publisher) heartbeat(now time.Time, max int, send func([]byte) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.split.max = max
	p.split.emit = func(b []byte) error {
		if err := send(p.sealed(&p.sealBuf, &p.sealAD, b, kindBatch)); err != nil {
			p.m.publishErrors.Inc()
			return nil
		}
		p.m.heartbeats.Inc()
		p.lastSent = now
		return nil
	}
	p.split.start(header{Kind: kindBatch, Node: p.self.Node, Incarnation: p.self.Incarnation, SentAtMS: now.UnixMilli(), Seq: p.seq})
	p.split.flush(true)
	p.seq = p.split.msg.Seq
}

// antiEntropy appends to dst this tick's share of this node's live counts
// that were published (all of them, for a store that does not say which):
// every AntiEntropy a snapshot of them is taken and published again over
// the following ticks, so that a count whose batch was lost reaches the
// peers even if its key never changes again. Counts merge by max, so a
// repeated one changes nothing.
func (p *publisher) antiEntropy(dst []counter.WindowCount, now time.Time) []counter.WindowCount {
	if p.cfg.AntiEntropy < 0 {
		return dst
	}
	if len(p.aeQueue) == 0 {
		if now.Before(p.aeNext) {
			return dst
		}
		p.aeNext = now.Add(p.cfg.AntiEntropy)
		p.aeQueue = p.aeQueue[:0]
		p.aeQueue = p.store.Reported(p.aeQueue, now)
		if len(p.aeQueue) == 0 {
			return dst
		}
		// Spread over the ticks of one period, so the period bounds the repair.
		ticks := max(1, int(p.cfg.AntiEntropy/p.cfg.SyncInterval))
		p.aeShare = (len(p.aeQueue) + ticks - 1) / ticks
	}
	n := min(len(p.aeQueue), p.aeShare)
	sent := 0
	for _, c := range p.aeQueue[len(p.aeQueue)-n:] {
		if counter.Live(c.Algorithm, c.ScaleMS, c.Window, now) {
			dst = append(dst, c)
			sent++
		}
	}
	clear(p.aeQueue[len(p.aeQueue)-n:])
	p.aeQueue = p.aeQueue[:len(p.aeQueue)-n]
	p.m.antiEntropy.Add(float64(sent))
	return dst
}

// publishChanges publishes, with send, the counts changed since the last
// call (and those of a failed publish before, and with withAE a share of
// the anti-entropy counts), in messages of at most max bytes. It returns
// how many messages it published.
func (p *publisher) publishChanges(now time.Time, max int, send func([]byte) error, withAE bool) (batches int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.now()
	var stale int
	p.changes, stale = p.store.Changes(p.changes[:0], now)
	if stale > 0 {
		p.m.dropped.staleLocal.Add(float64(stale))
	}
	tab := p.tab.Load()
	if p.lastTab != nil && p.lastTab != tab {
		p.retry = p.sameBuckets(p.retry, p.lastTab, tab)
		p.aeQueue = p.sameBuckets(p.aeQueue, p.lastTab, tab)
	}
	p.lastTab = tab
	if len(p.retry) > 0 {
		for _, c := range p.retry {
			if counter.Live(c.Algorithm, c.ScaleMS, c.Window, now) {
				p.changes = append(p.changes, c)
			}
		}
		clear(p.retry)
		p.retry = p.retry[:0]
	}
	fresh := len(p.changes)
	if withAE {
		p.changes = p.antiEntropy(p.changes, now)
	}
	if len(p.changes) == 0 {
		return 0
	}
	failed := false
	sent := 0
	p.split.max = max
	p.split.emit = func(b []byte) error {
		if err := send(p.sealed(&p.sealBuf, &p.sealAD, b, kindBatch)); err != nil {
			p.m.publishErrors.Inc()
			if !failed {
				p.log.Warn("publish batch", "err", err)
			}
			failed = true
			return nil
		}
		p.m.batchesSent.Inc()
		p.lastSent = now
		batches++
		sent += len(p.split.msg.Entries)
		return nil
	}
	p.split.start(header{Kind: kindBatch, Node: p.self.Node, Incarnation: p.self.Incarnation, SentAtMS: now.UnixMilli(), Seq: p.seq})
	for _, c := range p.changes {
		name := tab.name(c.Bucket)
		if name == "" { // a bucket a reload removed
			p.m.dropped.unknownBucket.Inc()
			continue
		}
		l := wireLimit{Name: name, ScaleMS: c.ScaleMS, Algorithm: c.Algorithm}
		if err := p.split.add(l, origin{}, c.Window, c.Key, c.Count); errors.Is(err, errEntryTooLarge) {
			p.m.dropped.tooLarge.Inc()
		}
	}
	p.split.flush(false)
	p.seq = p.split.msg.Seq
	p.m.entriesSent.Add(float64(sent))
	if failed {
		// Offer everything again next time: counts are running counts, so
		// what did go out is merely repeated. (Anti-entropy counts come
		// round again anyway.)
		n := min(fresh, maxPending)
		p.retry = append(p.retry[:0], p.changes[:n]...)
	}
	clear(p.changes[fresh:]) // drop the anti-entropy key strings
	p.m.publishDuration.Observe(p.now().Sub(start).Seconds())
	return batches
}

// sameBuckets keeps the counts of cs whose id names the same bucket under
// now as under then, the table they were taken under; the others (a bucket
// a reload removed, or whose id it gave to another bucket) are dropped and
// counted as unknown buckets, never sent under another bucket's name.
func (p *publisher) sameBuckets(cs []counter.WindowCount, then, now *table) []counter.WindowCount {
	kept := cs[:0]
	for _, c := range cs {
		if name := then.name(c.Bucket); name != "" && name == now.name(c.Bucket) {
			kept = append(kept, c)
			continue
		}
		p.m.dropped.unknownBucket.Inc()
	}
	clear(cs[len(kept):]) // drop the key strings
	return kept
}
