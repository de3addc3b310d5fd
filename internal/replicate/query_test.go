package replicate

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// TestAskGathersAnswers: in a sealed cluster of three, a query reaches
// both peers; the one that answers is heard, with its identity, and the
// one without an answerer is named missing once the context ends; a peer
// of the table gone silent is named missing too, without a wait.
func TestAskGathersAnswers(t *testing.T) {
	srv := testnats.Run(t)
	key := bytes.Repeat([]byte{7}, KeySize)
	var nodes []*live
	for i := range 3 {
		nodes = append(nodes, startLive(t, srv.ClientURL(), fmt.Sprintf("n%d", i), Config{Keys: [][]byte{key}}, nodeOpts{}))
	}
	for _, nd := range nodes {
		nd.waitReady(t)
	}
	nodes[1].r.SetAnswerer(func(q []byte) []byte { return append([]byte("n1 says "), q...) })
	// Every node heard from the others, so that the asker expects both.
	for _, nd := range nodes {
		waitPeers(t, nd, 2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	answers, missing, err := nodes[0].r.Ask(ctx, []byte("who?"))
	if err != nil {
		t.Fatal(err)
	}
	id1, inc1 := nodes[1].r.Identity()
	if len(answers) != 1 || answers[0].Node != id1 || answers[0].Incarnation != inc1 || string(answers[0].Body) != "n1 says who?" {
		t.Errorf("answers %+v", answers)
	}
	id2, inc2 := nodes[2].r.Identity()
	if len(missing) != 1 || missing[0].Node != id2 || missing[0].Incarnation != inc2 {
		t.Errorf("missing %+v, want n2", missing)
	}

	// With both answering, Ask returns as soon as both have.
	nodes[2].r.SetAnswerer(func(q []byte) []byte { return []byte("n2") })
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	answers, missing, err = nodes[0].r.Ask(ctx, nil)
	if err != nil || len(answers) != 2 || len(missing) != 0 {
		t.Errorf("Ask: %+v, missing %+v, %v", answers, missing, err)
	}
	if ctx.Err() != nil {
		t.Errorf("Ask waited for its context (%v) with every peer answered", time.Since(start))
	}

	// A peer gone silent 10 s ago (killed: no clean leave), still in the
	// peer table: named missing, without waiting for it. An incarnation
	// of n1 from before a restart (n1 answers under its new one) is not.
	nodes[0].r.peers.get("gone", 42, time.Now().Add(-10*time.Second), true)
	nodes[0].r.peers.get(id1, inc1+1, time.Now().Add(-10*time.Second), true)
	start = time.Now()
	answers, missing, err = nodes[0].r.Ask(ctx, nil)
	if err != nil || len(answers) != 2 || len(missing) != 1 || missing[0].Node != "gone" || missing[0].Incarnation != 42 {
		t.Errorf("with a silent peer: %+v, missing %+v, %v", answers, missing, err)
	}
	if ctx.Err() != nil {
		t.Errorf("Ask waited for its context (%v) for a peer silent for 10 s", time.Since(start))
	}
}

func waitPeers(t *testing.T, nd *live, n int) {
	t.Helper()
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := len(nd.r.peers.live(nil, time.Now().Add(-shareLive*nd.r.cfg.Heartbeat))); got < n {
			return fmt.Errorf("%s heard from %d peers, want %d", nd.id, got, n)
		}
		return nil
	})
}
