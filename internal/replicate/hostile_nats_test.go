package replicate

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// malformedTotal is the sum of a node's messages_malformed_total.
func malformedTotal(t testing.TB, n *live) float64 {
	return sumReasons(t, n.r.m.malformed.reasons())
}

// TestHostileTrafficRealNATS floods every subject the nodes listen on —
// batches, sync requests, and the inbox of a warm start in progress —
// with thousands of hostile messages through a real nats-server while the
// nodes count real traffic: no node dies, no decision changes, every kind
// is counted.
func TestHostileTrafficRealNATS(t *testing.T) {
	srv := testnats.StartProcess(t)
	lim := counter.Limit{Limit: 1 << 30, ScaleMS: long.ScaleMS}
	victim := counter.Limit{Limit: 10, ScaleMS: long.ScaleMS}
	cfg := Config{
		Keys:            [][]byte{keyA},
		MaxMessageBytes: 64 << 10, // below the server's max_payload, so oversized ones arrive
		Buckets:         bounded(map[int64]int64{long.ScaleMS: snapshot.BoundFor(lim.Limit)}, map[int64]int64{long.ScaleMS: snapshot.BoundFor(lim.Limit)}),
		// Short, so that replayed sync requests are refused by rate too.
		SyncAnswersPerSecond: 2,
		WarmStartTimeout:     waitLong,
		// Shares off: every real count is replicated, so each node's view
		// of the real traffic is exact and a forged count would show.
		ShareDelay: -1,
	}
	a := startLive(t, srv.URL(), "a", cfg, nodeOpts{})
	b := startLive(t, srv.URL(), "b", cfg, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)

	// The attacker: a plain NATS client that records what goes by.
	evil, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	var capMu sync.Mutex
	var capBatches, capRequests [][]byte
	var replies atomic.Int64
	inboxes := make(chan string, 16)
	if _, err := evil.Subscribe("ratelimit.batch", func(m *nats.Msg) {
		capMu.Lock()
		if len(capBatches) < 64 {
			capBatches = append(capBatches, bytes.Clone(m.Data))
		}
		capMu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := evil.Subscribe("ratelimit.sync", func(m *nats.Msg) {
		capMu.Lock()
		capRequests = append(capRequests, bytes.Clone(m.Data))
		capMu.Unlock()
		select {
		case inboxes <- m.Reply:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	// Replies the attacker gets for replayed requests: sealed, unreadable.
	myInbox := nats.NewInbox()
	if _, err := evil.Subscribe(myInbox, func(m *nats.Msg) {
		if len(m.Data) == 0 {
			return // NATS's "no responders" status, for publishes to an inbox that is gone
		}
		replies.Add(1)
		if !isSealed(m.Data) || bytes.Contains(m.Data, []byte("victim")) || bytes.Contains(m.Data, []byte("legit")) {
			t.Errorf("a sync reply to the attacker is readable: %q", m.Data)
		}
	}); err != nil {
		t.Fatal(err)
	}
	evil.Flush()

	// Real traffic: both nodes count "legit" all along, and "victim" 3 times each.
	for _, n := range []*live{a, b} {
		for range 3 {
			n.store.Take(0, "victim", victim, time.Now())
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, n := range []*live{a, b} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
					n.store.Take(0, "legit", lim, time.Now())
				}
			}
		})
	}
	poll.Until(t, waitLong, step, func() error {
		capMu.Lock()
		defer capMu.Unlock()
		if len(capBatches) < 8 {
			return fmt.Errorf("%d batches captured", len(capBatches))
		}
		return nil
	})

	// A node starting during the flood: its warm start's inbox is attacked too.
	c := startLive(t, srv.URL(), "c", cfg, nodeOpts{})
	var inbox string
	select {
	case inbox = <-inboxes:
	case <-time.After(waitLong):
		t.Fatal("no sync request seen")
	}

	rng := rand.New(rand.NewPCG(1, 2))
	capMu.Lock()
	batches := capBatches[:8]
	request := capRequests[0]
	capMu.Unlock()
	now := time.Now()
	kinds := map[string]func() []byte{
		"garbage": func() []byte {
			g := make([]byte, 1+rng.IntN(300))
			for i := range g {
				g[i] = byte(rng.Uint32())
			}
			return g
		},
		"bit flip": func() []byte {
			d := bytes.Clone(batches[rng.IntN(len(batches))])
			d[rng.IntN(len(d))] ^= 1 << rng.IntN(8)
			return d
		},
		"truncated": func() []byte {
			d := batches[rng.IntN(len(batches))]
			return bytes.Clone(d[:rng.IntN(len(d))])
		},
		"oversized":   func() []byte { return make([]byte, 100<<10) },
		"wrong key":   func() []byte { return sealWith(t, keyB, "ratelimit", forged("a", 1, now, "victim", 100)) },
		"unsealed":    func() []byte { return enc(forged("a", 1, now, "victim", 100)) },
		"invalid id":  func() []byte { return enc(forged("\xff\xff", 1, now, "victim", 100)) },
		"sealed kind": func() []byte { return sealWith(t, keyA, "elsewhere", forged("a", 1, now, "victim", 100)) },
	}
	const perKind = 400
	sent := 0
	for kind, gen := range kinds {
		for i := range perKind {
			for _, subj := range []string{"ratelimit.batch", "ratelimit.sync", inbox} {
				if err := evil.PublishRequest(subj, myInbox, gen()); err != nil {
					t.Fatalf("%s: %v", kind, err)
				}
				sent++
			}
			if i%50 == 0 {
				evil.Flush()
			}
		}
	}
	// Authentic messages replayed: captured batches (merged by max: no
	// change) and a captured sync request (answered, sealed, rate-bound).
	const replays = 200
	for i := range replays {
		evil.Publish("ratelimit.batch", batches[i%len(batches)])
		evil.PublishRequest("ratelimit.sync", myInbox, request)
	}
	evil.Flush()
	t.Logf("%d hostile messages (%d kinds × %d × 3 subjects) and %d replays", sent, len(kinds), perKind, 2*replays)

	c.waitReady(t)
	close(stop)
	wg.Wait()

	// Every hostile message on the batch and sync subjects was counted as
	// malformed by each of a and b (all of them are: none opens).
	want := float64(len(kinds) * perKind * 2)
	for _, n := range []*live{a, b} {
		poll.Until(t, waitLong, step, func() error {
			if got := malformedTotal(t, n); got < want {
				return fmt.Errorf("%s counted %v malformed, want %v", n.id, got, want)
			}
			// Replays of its own batches are "self", of its peer's "repeated".
			if got := metric(t, n.r.m.batchesRepeated) + metric(t, n.r.m.malformed.self); got < replays {
				return fmt.Errorf("%s counted %v replays, want %d", n.id, got, replays)
			}
			if got := metric(t, n.r.m.syncServed) + metric(t, n.r.m.syncRefused.rate); got < replays {
				return fmt.Errorf("%s answered or refused %v sync requests, want ≥ %d", n.id, got, replays)
			}
			return nil
		})
		mal := &n.r.m.malformed
		for _, c := range []struct {
			reason  string
			c       prometheus.Counter
			atLeast float64
		}{
			{"oversize", mal.oversize, 2 * perKind}, {"unknown_key", mal.unknownKey, 2 * perKind},
			{"unsealed", mal.unsealed, 2 * 2 * perKind}, {"unauthentic", mal.auth, 2 * perKind},
		} {
			if got := metric(t, c.c); got < c.atLeast {
				t.Errorf("%s: malformed{%s} = %v, want ≥ %v", n.id, c.reason, got, c.atLeast)
			}
		}
		if got := metric(t, n.r.m.panics); got != 0 {
			t.Errorf("%s: %v panics", n.id, got)
		}
		if got := metric(t, n.r.m.syncServed); got > 2+2*10 {
			t.Errorf("%s: answered %v sync requests, want at most a burst of 2 and 2 a second", n.id, got)
		}
		if !n.connected() {
			t.Errorf("%s: not connected", n.id)
		}
	}
	if got := malformedTotal(t, c); got < float64(len(kinds)*perKind) {
		t.Errorf("c counted %v malformed on its inbox, want ≥ %d", got, len(kinds)*perKind)
	}
	for _, n := range []*live{a, b} {
		for _, r := range n.r.m.malformed.reasons() {
			t.Logf("%s: malformed{%s} = %v", n.id, r.label, metric(t, *r.c))
		}
		t.Logf("%s: repeated %v, missed %v, received %v", n.id, metric(t, n.r.m.batchesRepeated), metric(t, n.r.m.batchesMissed), metric(t, n.r.m.batchesReceived))
	}
	poll.Until(t, waitLong, step, func() error {
		if replies.Load() == 0 {
			return fmt.Errorf("no answer to a replayed sync request (answered: a %v, b %v): the disclosure check checks nothing",
				metric(t, a.r.m.syncServed), metric(t, b.r.m.syncServed))
		}
		return nil
	})
	t.Logf("sync replies the attacker received (sealed): %d", replies.Load())

	// Decisions unchanged: every node sees exactly the real counts.
	legit := a.local(0, "legit") + b.local(0, "legit")
	_, va := counts(a.store, 0, "victim", victim, time.Now())
	for _, n := range []*live{a, b, c} {
		poll.Until(t, waitLong, step, func() error {
			if got := n.total(0, "legit"); got != legit {
				return fmt.Errorf("%s sees %d legit, want %d", n.id, got, legit)
			}
			if _, got := counts(n.store, 0, "victim", victim, time.Now()); got != 6 {
				return fmt.Errorf("%s sees %d victim, want 6 (a sees %d)", n.id, got, va)
			}
			return nil
		})
		if !n.store.Peek(0, "victim", victim, time.Now()).Allowed {
			t.Errorf("%s denies the victim", n.id)
		}
	}
}

// TestHostileTrafficWithoutKey: a node without a cluster key is not
// protected from forged counts, but malformed messages still neither
// crash it nor enter its peer table; each kind is counted.
func TestHostileTrafficWithoutKey(t *testing.T) {
	srv := testnats.StartProcess(t)
	a := startLive(t, srv.URL(), "a", Config{MaxMessageBytes: 64 << 10}, nodeOpts{})
	a.waitReady(t)
	evil, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	good := enc(forged("p", 1, time.Now(), "k", 1))
	mal := &a.r.m.malformed
	kinds := map[string]struct {
		gen    func() []byte
		reason prometheus.Counter
	}{
		"invalid id": {func() []byte { return enc(forged("\xff\xff", 1, time.Now(), "victim", 100)) }, mal.decode},
		"garbage":    {func() []byte { return append([]byte("RL\x01\x01"), byte(rng.Uint32())) }, mal.decode},
		"truncated":  {func() []byte { return good[:4+rng.IntN(len(good)-5)] }, mal.decode},
		"oversized":  {func() []byte { return make([]byte, 100<<10) }, mal.oversize},
		"sealed":     {func() []byte { return sealWith(t, keyA, "ratelimit", forged("p", 1, time.Now(), "k", 1)) }, mal.noKey},
		"version":    {func() []byte { return []byte("RL\x09\x01") }, mal.version},
	}
	const n = 300
	for _, k := range kinds {
		for range n {
			evil.Publish("ratelimit.batch", k.gen())
		}
		evil.Flush()
	}
	for name, k := range kinds {
		poll.Until(t, waitLong, step, func() error {
			if got := metric(t, k.reason); got < n {
				return fmt.Errorf("%s: malformed = %v, want ≥ %d", name, got, n)
			}
			return nil
		})
	}
	if a.r.peers.len() != 0 || metric(t, a.r.m.panics) != 0 || !a.connected() {
		t.Errorf("%d peers, %v panics, connected %v", a.r.peers.len(), metric(t, a.r.m.panics), a.connected())
	}
}
