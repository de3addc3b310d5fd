package replicate

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// A link is taken as down when the server answers none of pingsOut + 1
// pings in a row (PingInterval apart), or a write to it stalls for
// writeStall pings: a silent cut is noticed within (pingsOut + 2) ×
// PingInterval, however little the node publishes.
const (
	pingsOut   = 2
	writeStall = 2
)

// connect dials NATS with the configured options and the Replicator's
// own: no echo, retries for ever in the background, pings that notice a
// silent cut, and handlers that keep the link's state (read without the
// client's lock, see connected), log its changes and ask for a resync
// when counts may have been missed. offline, set by Run when NATS was not
// reachable at start, makes the first connection resync too (else the
// warm start covers it).
func (r *Replicator) connect(ctx context.Context, offline *atomic.Bool) (*nats.Conn, error) {
	opts := append(slices.Clone(r.cfg.Options),
		nats.Name("ratelimit-authz "+r.cfg.NodeID),
		nats.NoEcho(),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.PingInterval(r.cfg.PingInterval),
		nats.MaxPingsOutstanding(pingsOut),
		nats.FlusherTimeout(writeStall*r.cfg.PingInterval),
		nats.ReconnectOnFlusherError(),
		nats.ConnectHandler(func(*nats.Conn) {
			r.up.Store(true)
			r.log.Info("connected to NATS")
			if offline.Load() {
				r.syncer.requestResync()
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			r.up.Store(true)
			r.reconnects.Add(1)
			r.log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted())
			r.syncer.requestResync()
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			r.up.Store(false)
			if ctx.Err() == nil {
				r.log.Warn("disconnected from NATS; limiting on this node's counts until it is back", "err", err)
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { r.up.Store(false) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				// Messages were dropped before this node read them: some
				// of peers' counts may be missing; ask for all of them.
				r.m.slowConsumer.Inc()
				r.log.Warn("NATS slow consumer: messages dropped before they were read; resyncing from peers", "err", err)
				r.syncer.requestResync()
				return
			}
			r.log.Warn("NATS asynchronous error", "err", err)
		}),
	)
	nc, err := nats.Connect(r.cfg.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("replicate: connect to NATS: %w", err)
	}
	return nc, nil
}

// subscribe subscribes to the batch, sync, query and cast subjects; NATS calls each
// handler for one message at a time.
func (r *Replicator) subscribe(nc *nats.Conn) error {
	for _, s := range []struct {
		subj string
		h    nats.MsgHandler
	}{
		{r.batchSubj, r.guard("batch", r.recv.onBatch)},
		{r.syncSubj, r.guard("sync request", func(m *nats.Msg) { r.syncer.onRequest(nc, m) })},
		{r.querySubj, r.guard("query", func(m *nats.Msg) { r.onQuery(nc, m) })},
		{r.castSubj, r.guard("cast", r.onCast)},
	} {
		sub, err := nc.Subscribe(s.subj, s.h)
		if err != nil {
			return fmt.Errorf("replicate: subscribe %s: %w", s.subj, err)
		}
		if r.hooks.subPending > 0 {
			if err := sub.SetPendingLimits(r.hooks.subPending, -1); err != nil {
				return fmt.Errorf("replicate: pending limits of %s: %w", s.subj, err)
			}
		}
	}
	return nil
}

func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		u, err := url.Parse(p)
		switch {
		case err != nil:
			parts[i] = "(unparsable URL)"
		case u.User != nil:
			if _, has := u.User.Password(); !has {
				u.User = url.User("xxxxx") // a user alone may be a token
			}
			parts[i] = u.Redacted()
		default:
			parts[i] = p
		}
	}
	return strings.Join(parts, ",")
}
