package replicate

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// castLog records the casts a node received.
type castLog struct {
	mu  sync.Mutex
	got []string
	ids []counter.PeerID
}

func (c *castLog) handle(from counter.PeerID, body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, string(body))
	c.ids = append(c.ids, from)
}

func (c *castLog) wait(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	poll.Until(t, waitLong, step, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		got = append(got[:0], c.got...)
		if len(got) < n {
			return fmt.Errorf("%d casts received, want %d", len(got), n)
		}
		return nil
	})
	return got
}

// TestCastReachesPeersOnceSealed: a cast reaches every peer, in order,
// under the sender's peer id; on the wire it is sealed; a replayed copy,
// a copy resealed for another kind and a forged unsealed one are dropped
// and counted.
func TestCastReachesPeersOnceSealed(t *testing.T) {
	srv := testnats.Run(t)
	cfg := Config{Keys: [][]byte{bytes.Repeat([]byte{3}, KeySize)}}
	a := startLive(t, srv.ClientURL(), "a", cfg, nodeOpts{})
	b := startLive(t, srv.ClientURL(), "b", cfg, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	var logB castLog
	b.r.SetCastHandler(logB.handle)

	evil, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	var capMu sync.Mutex
	var captured [][]byte
	if _, err := evil.Subscribe("ratelimit.cast", func(m *nats.Msg) {
		capMu.Lock()
		captured = append(captured, bytes.Clone(m.Data))
		capMu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := evil.Flush(); err != nil {
		t.Fatal(err)
	}

	for i := range 3 {
		if err := a.r.Cast([]byte(fmt.Sprint("secret-body-", i))); err != nil {
			t.Fatal(err)
		}
	}
	got := logB.wait(t, 3)
	if fmt.Sprint(got) != "[secret-body-0 secret-body-1 secret-body-2]" {
		t.Fatalf("b received %q", got)
	}
	logB.mu.Lock()
	if logB.ids[0] != logB.ids[2] || logB.ids[0] == 0 {
		t.Errorf("peer ids %v: want one nonzero id for a", logB.ids)
	}
	logB.mu.Unlock()

	poll.Until(t, waitLong, step, func() error {
		capMu.Lock()
		defer capMu.Unlock()
		if len(captured) < 3 {
			return fmt.Errorf("%d captured", len(captured))
		}
		return nil
	})
	capMu.Lock()
	replay := captured[0]
	for _, c := range captured {
		if !isSealed(c) || bytes.Contains(c, []byte("secret-body")) {
			t.Errorf("a cast is readable on the wire: %q", c)
		}
	}
	capMu.Unlock()

	before := metric(t, b.r.m.malformed.replayed)
	unauth := metric(t, b.r.m.malformed.auth)
	unsealed := metric(t, b.r.m.malformed.unsealed)
	forged := message{header: header{Kind: kindCast, Node: "a", Incarnation: a.r.self.Incarnation, SentAtMS: a.r.now().UnixMilli(), Seq: 1 << 40}, Body: "forged"}
	for subj, data := range map[string][]byte{
		"ratelimit.cast":  replay,
		"ratelimit.batch": replay, // a cast does not open as a batch
	} {
		if err := evil.Publish(subj, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := evil.Publish("ratelimit.cast", forged.encode(nil)); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, waitLong, step, func() error {
		r, u, s := metric(t, b.r.m.malformed.replayed)-before, metric(t, b.r.m.malformed.auth)-unauth, metric(t, b.r.m.malformed.unsealed)-unsealed
		if r != 1 || u != 1 || s != 1 {
			return fmt.Errorf("replayed %v, unauthentic %v, unsealed %v; want 1, 1, 1", r, u, s)
		}
		return nil
	})
	// A later cast still arrives: the forgeries moved nothing.
	if err := a.r.Cast([]byte("after")); err != nil {
		t.Fatal(err)
	}
	if got := logB.wait(t, 4); got[3] != "after" || len(got) != 4 {
		t.Fatalf("b received %q", got)
	}
	if err := a.r.Cast(make([]byte, a.r.MaxCast()+1)); err == nil {
		t.Error("a cast over MaxCast was sent")
	}
}
