package replicate

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// shippedNATS starts the real nats-server with deploy/nats/nats-server.conf.
func shippedNATS(t *testing.T) (p *testnats.Process, nodePass, appPass string) {
	t.Helper()
	conf, err := filepath.Abs("../../deploy/nats/nats-server.conf")
	if err != nil {
		t.Fatal(err)
	}
	nodePass, appPass = "node-secret-1", "app-secret-2"
	p = testnats.StartProcessConfig(t, conf, "RATELIMIT_NODE_NATS_PASSWORD="+nodePass, "APP_NATS_PASSWORD="+appPass)
	return p, nodePass, appPass
}

// asyncErrors connects as user and collects the server's asynchronous
// errors (permission violations).
type asyncErrors struct {
	mu   sync.Mutex
	errs []string
}

func (a *asyncErrors) add(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err.Error())
}

func (a *asyncErrors) waitFor(t *testing.T, substr string) {
	t.Helper()
	poll.Until(t, waitLong, step, func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, e := range a.errs {
			if strings.Contains(e, substr) {
				return nil
			}
		}
		return fmt.Errorf("no error with %q among %q", substr, a.errs)
	})
}

func connectAs(t *testing.T, url, user, pass string) (*nats.Conn, *asyncErrors) {
	t.Helper()
	ae := &asyncErrors{}
	nc, err := nats.Connect(url, nats.UserInfo(user, pass),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { ae.add(err) }))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc, ae
}

// TestShippedNATSPermissions: with the shipped nats-server config, nodes
// replicate (batches and warm starts, whose answers go to the requester's
// inbox), while another user's publishes and subscriptions on the
// replication subjects are refused by the server, and the nodes' user
// cannot publish elsewhere.
func TestShippedNATSPermissions(t *testing.T) {
	srv, nodePass, appPass := shippedNATS(t)
	// Shares off: every hit is replicated, whatever its key's share.
	cfg := Config{Keys: [][]byte{keyA}, Options: []nats.Option{nats.UserInfo("ratelimit-node", nodePass)}, WarmStartTimeout: waitLong, ShareDelay: -1}
	a := startLive(t, srv.URL(), "a", cfg, nodeOpts{})
	b := startLive(t, srv.URL(), "b", cfg, nodeOpts{})
	a.waitReady(t)
	b.waitReady(t)
	for range 5 {
		a.store.Take(0, "acme", long, time.Now())
	}
	allSee(t, []*live{a, b}, 0, "acme", 5)
	// A restarted node warms up: the sync answers reach its inbox.
	b.stop(t)
	b2 := startLive(t, srv.URL(), "b", cfg, nodeOpts{})
	b2.waitReady(t)
	if got := b2.total(0, "acme"); got != 5 {
		t.Errorf("restarted b warmed up to %d, want 5", got)
	}
	if got := metric(t, b2.r.m.syncMerged); got < 1 {
		t.Errorf("sync entries merged %v: no answer reached the inbox", got)
	}

	// Another user: its publishes on the replication subjects are refused
	// and reach no node; it cannot subscribe to them or to inboxes.
	app, appErrs := connectAs(t, srv.URL(), "app", appPass)
	before := metric(t, a.r.m.batchesReceived) + metric(t, a.r.m.malformed.unsealed)
	for _, subj := range []string{"ratelimit.batch", "ratelimit.sync"} {
		if err := app.Publish(subj, enc(forged("evil", 1, time.Now(), "acme", 100))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := app.Subscribe("ratelimit.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Subscribe("_INBOX.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	app.Flush()
	appErrs.waitFor(t, `Permissions Violation for Publish to "ratelimit.batch"`)
	appErrs.waitFor(t, `Permissions Violation for Publish to "ratelimit.sync"`)
	appErrs.waitFor(t, `Permissions Violation for Subscription to "ratelimit.>"`)
	appErrs.waitFor(t, `Permissions Violation for Subscription to "_INBOX.>"`)
	// A node batch after the refused ones: once it is in, the refused
	// ones would have been too.
	a.store.Take(0, "acme", long, time.Now())
	allSee(t, []*live{a, b2}, 0, "acme", 6)
	if after := metric(t, a.r.m.batchesReceived) + metric(t, a.r.m.malformed.unsealed); after-before > 1 {
		t.Errorf("a read %v messages, want at most b2's heartbeat", after-before)
	}
	if got := metric(t, a.r.m.malformed.unsealed); got != 0 {
		t.Errorf("an unsealed message reached a: %v", got)
	}

	// The nodes' user may not publish elsewhere, nor to an inbox nobody
	// asked it to answer.
	node, nodeErrs := connectAs(t, srv.URL(), "ratelimit-node", nodePass)
	node.Publish("orders.created", []byte("x"))
	node.Publish("_INBOX.someone", []byte("x"))
	node.Flush()
	nodeErrs.waitFor(t, `Permissions Violation for Publish to "orders.created"`)
	nodeErrs.waitFor(t, `Permissions Violation for Publish to "_INBOX.someone"`)

	// A wrong password does not connect.
	if nc, err := nats.Connect(srv.URL(), nats.UserInfo("ratelimit-node", "guess"), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("connected with a wrong password")
	}
}
