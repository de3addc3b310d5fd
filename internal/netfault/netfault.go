// Package netfault is a TCP relay for tests that makes a link behave as a
// bad network does: a delay each way, jitter, the stalls that lost
// packets cost (TCP retransmits them: the bytes arrive, late and in
// order), and cuts that drop traffic silently, without a reset, as a
// firewall or a failed switch does. Put it between a node and
// nats-server; Set changes the faults of every connection at once.
//
// Invariants: bytes are delivered in order and never lost or duplicated
// while a connection lives; a cut stops reading and writing both ways
// (the sender's socket buffers fill and its writes block, as on a dead
// link), and the held bytes flow once the cut heals; at most maxQueued
// bytes wait in the relay per direction.
package netfault

import (
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Faults are what a link does to the bytes it carries, each way.
type Faults struct {
	// Delay is the one-way delay of every byte.
	Delay time.Duration
	// Jitter adds up to this much to the delay of each read chunk
	// (uniform); bytes stay in order, so a late chunk delays the next.
	Jitter time.Duration
	// Loss is the chance that a read chunk is lost once and
	// retransmitted: it arrives RTO later (and the chunks behind it wait).
	Loss float64
	// RTO is a retransmission's delay; default 200 ms, Linux's least.
	RTO time.Duration
	// Cut drops everything silently: no byte moves either way, no
	// connection is reset; new connections are accepted and hang.
	Cut bool
}

// maxQueued bounds the bytes waiting in the relay per direction; past
// it the relay stops reading, as a receiver's full window does.
const maxQueued = 1 << 20

// Relay forwards the connections accepted on Addr to a target address
// through Faults.
type Relay struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond // signalled when faults change or a link closes
	faults Faults
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Start listens on a free loopback port and relays to target until the
// test ends.
func Start(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("netfault: listen: %v", err)
	}
	r := &Relay{ln: ln, target: target, links: map[*link]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.Close)
	return r
}

// Addr is the address to dial instead of the target.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// URL is Addr as a NATS URL.
func (r *Relay) URL() string { return "nats://" + r.Addr() }

// Set changes the faults of every connection, current and future.
func (r *Relay) Set(f Faults) {
	if f.RTO <= 0 {
		f.RTO = 200 * time.Millisecond
	}
	r.mu.Lock()
	r.faults = f
	r.cond.Broadcast()
	r.mu.Unlock()
}

// Faults returns the faults in effect.
func (r *Relay) Faults() Faults {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.faults
}

// Reset closes every connection now, as a link that goes down with a
// reset does; new ones are accepted.
func (r *Relay) Reset() {
	r.mu.Lock()
	for l := range r.links {
		l.close()
	}
	r.mu.Unlock()
}

// Close stops the relay and closes every connection.
func (r *Relay) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.cond.Broadcast()
	r.mu.Unlock()
	r.ln.Close()
	r.Reset()
	r.wg.Wait()
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{a: c, b: up}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			l.close()
			return
		}
		r.links[l] = struct{}{}
		r.mu.Unlock()
		var done sync.WaitGroup
		done.Add(2)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			done.Wait()
			r.mu.Lock()
			delete(r.links, l)
			r.mu.Unlock()
			l.close()
		}()
		for _, d := range []struct{ from, to net.Conn }{{c, up}, {up, c}} {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer done.Done()
				r.pipe(l, d.from, d.to)
			}()
		}
	}
}

// link is one relayed connection: a the client's side, b the target's.
type link struct {
	a, b net.Conn
	once sync.Once
	dead bool // under Relay.mu
}

func (l *link) close() {
	l.once.Do(func() {
		l.a.Close()
		l.b.Close()
	})
}

// chunk is bytes read at one time, due at a time.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe carries one direction: a reader that stamps each chunk with its
// due time and a writer that writes it then, both holding while cut.
func (r *Relay) pipe(l *link, from, to net.Conn) {
	var (
		queue  []chunk
		queued int
		eof    bool
		last   time.Time // the previous chunk's due time: order is kept
	)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 32<<10)
		for {
			r.mu.Lock()
			for !r.closed && !l.dead && (r.faults.Cut || queued >= maxQueued) {
				r.cond.Wait()
			}
			stop := r.closed || l.dead
			r.mu.Unlock()
			if stop {
				return
			}
			n, err := from.Read(buf)
			r.mu.Lock()
			if n > 0 {
				f := r.faults
				due := time.Now().Add(f.Delay)
				if f.Jitter > 0 {
					due = due.Add(rand.N(f.Jitter))
				}
				if f.Loss > 0 && rand.Float64() < f.Loss {
					due = due.Add(f.RTO)
				}
				if due.Before(last) {
					due = last
				}
				last = due
				queue = append(queue, chunk{append([]byte(nil), buf[:n]...), due})
				queued += n
			}
			if err != nil {
				eof = true
			}
			r.cond.Broadcast()
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	for {
		r.mu.Lock()
		for !r.closed && !l.dead && (len(queue) == 0 || r.faults.Cut) && !(eof && len(queue) == 0) {
			r.cond.Wait()
		}
		if r.closed || l.dead || len(queue) == 0 {
			// A side that closed closes the link once its bytes are out.
			l.dead = true
			r.cond.Broadcast()
			r.mu.Unlock()
			return
		}
		c := queue[0]
		r.mu.Unlock()
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait) // a cut that starts meanwhile holds the next chunk
		}
		if _, err := to.Write(c.data); err != nil {
			r.mu.Lock()
			l.dead = true
			r.cond.Broadcast()
			r.mu.Unlock()
			return
		}
		r.mu.Lock()
		queue = queue[1:]
		queued -= len(c.data)
		r.cond.Broadcast()
		r.mu.Unlock()
	}
}
