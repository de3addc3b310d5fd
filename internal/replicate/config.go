package replicate

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// Defaults of a zero Config field.
const (
	DefaultSubjectPrefix    = "ratelimit"
	DefaultSyncInterval     = 100 * time.Millisecond
	DefaultWarmStartTimeout = 2 * time.Second
	DefaultMaxPeers         = 64
	DefaultPeerExpiry       = time.Minute
	DefaultSkewWarning      = 500 * time.Millisecond
	DefaultFlushTimeout     = 2 * time.Second
	DefaultHeartbeat        = time.Second
	DefaultPingInterval     = time.Second
	DefaultAntiEntropy      = 10 * time.Second
	DefaultMaxClockSkew     = 30 * time.Second
	// DefaultSyncAnswersPerSecond bounds the sync requests a node answers,
	// from all requesters together (a burst of this many, refilled at this
	// rate): every node reconnecting at once after a NATS restart still
	// gets an answer from some peer, a flood of requests costs little.
	DefaultSyncAnswersPerSecond = 4
	// DefaultMaxMessageBytes bounds the messages read (and written, with the
	// server's max_payload, whichever is smaller).
	DefaultMaxMessageBytes = 8 << 20
)

// Internal bounds.
const (
	maxPending  = 1 << 16 // counts kept for a retry after a failed publish, or deferred
	syncCacheAt = time.Second
)

// Config configures a Replicator. A zero field means its default.
type Config struct {
	// URL is the NATS server URL, or several separated by commas. Required.
	URL string
	// Options are nats.go options for credentials and TLS (UserCredentials,
	// Nkey, UserInfo, Token, RootCAs, ClientCert, …). The Replicator adds
	// its own after them: NoEcho, RetryOnFailedConnect, unlimited
	// reconnects, and its connection handlers.
	Options []nats.Option
	// Buckets are the configured buckets, replicated by name (see Bucket,
	// Replicator.Prepare). Required.
	Buckets []Bucket
	// NodeID names this node in its logs and its peers'; default the host
	// name. A process's identity is its node id and a random incarnation,
	// drawn at New: two processes never share one, whatever their node
	// ids, and each takes its own budget share. Several live processes
	// claiming one node id are logged and counted
	// (duplicate_node_ids_total), nothing else.
	NodeID string
	// SubjectPrefix: batches go to <prefix>.batch, sync requests to
	// <prefix>.sync; default "ratelimit".
	SubjectPrefix string
	// SyncInterval is how often changed counts are published; 100 ms.
	SyncInterval time.Duration
	// WarmStartTimeout bounds the wait for peers' counts before Ready; 2 s.
	WarmStartTimeout time.Duration
	// MaxPeers bounds the peers tracked at once; 64.
	MaxPeers int
	// PeerExpiry: a peer silent this long (no batch, no heartbeat) is
	// forgotten; 1 min. If it speaks again it gets its old peer id back.
	PeerExpiry time.Duration
	// SkewWarning: a peer whose clock is further off than this (the least
	// receive minus send time of its batches over ten heartbeats), and a
	// batch that waited longer than this before it was read (beyond the
	// skew), are logged, each at most once a minute per peer; 500 ms.
	SkewWarning time.Duration
	// MaxMessageBytes bounds messages read and written; 8 MiB (writes are
	// also bounded by the server's max_payload).
	MaxMessageBytes int
	// FlushTimeout bounds the final publish at shutdown; 2 s.
	FlushTimeout time.Duration
	// EarlyGap spaces early batches: when a local hit leaves a key near
	// its limit (see counter.Store.NearLimit), the node publishes its
	// changes at once rather than at the next tick, but at most once per
	// EarlyGap (a signal within the gap is served at its end); a charge
	// that spent a budget (counter.Store.Spent) is published at once,
	// at most once more per EarlyGap. Default SyncInterval/10; negative
	// turns early batches off.
	EarlyGap time.Duration
	// ShareDelay is the least time after publishing a count before a
	// node takes its peers to hold it, and their answers to it, and grows
	// its budget shares (see docs/design/replication.md). The delay in effect is the larger of
	// this and EarlyGap (SyncInterval without early batches) plus twice
	// the peers' delivery delay (their latest batches', at least 2.5 ms,
	// at most a SyncInterval). Negative turns shares off: every change is
	// replicated, and each node admits on its own view up to the whole
	// limit.
	ShareDelay time.Duration

	// Keys are the cluster keys, KeySize bytes each: messages are sealed
	// with the first and opened with either (a rotation: add the new key
	// as second, then make it first everywhere, then drop the old one).
	// None: messages are neither sealed nor authenticated — anyone who
	// can publish on the subjects can then change counts (see
	// docs/security.md).
	Keys [][]byte
	// Heartbeat: a node that published nothing for this long publishes an
	// empty batch, so that peers know it is alive; 1 s.
	Heartbeat time.Duration
	// PingInterval: the node pings the NATS server this often; a link
	// that answers none of pingsOut pings in a row, or whose writes stall
	// for writeStall pings, is taken as down (a silent cut: packets
	// dropped without a reset) and the node reconnects, limiting on its
	// own counts meanwhile; 1 s.
	PingInterval time.Duration
	// AntiEntropy is the period over which every live count of this node
	// is published again, a part with each batch, so that a lost batch of
	// a key that stopped changing is repaired within about this period;
	// 10 s, negative turns it off.
	AntiEntropy time.Duration
	// MaxClockSkew: a message whose send time is further than this from
	// this node's clock is dropped (a replay, or a clock that is off); 30 s.
	MaxClockSkew time.Duration
	// SyncAnswersPerSecond bounds the sync requests answered, in all; 4.
	SyncAnswersPerSecond int
	// Now is the clock every time of the package is read from: send
	// times, the window a count belongs to, peer liveness and skew, the
	// heartbeat, anti-entropy, early-gap and sync-cache periods, and the
	// durations in logs and metrics; time.Now by default. Ticks are
	// aligned to it; timers and timeouts run on real time.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.URL == "" {
		return errors.New("replicate: no NATS URL")
	}
	if c.NodeID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return fmt.Errorf("replicate: no node id and no host name: %v", err)
		}
		c.NodeID = h
	}
	if !validNode(c.NodeID) {
		return fmt.Errorf("replicate: node id %q: want 1 to %d bytes of printable ASCII without spaces", c.NodeID, maxNodeLen)
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	for _, tok := range strings.Split(c.SubjectPrefix, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return fmt.Errorf("replicate: subject prefix %q is not a valid NATS subject without wildcards", c.SubjectPrefix)
		}
	}
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{
		{&c.SyncInterval, DefaultSyncInterval}, {&c.WarmStartTimeout, DefaultWarmStartTimeout},
		{&c.PeerExpiry, DefaultPeerExpiry}, {&c.SkewWarning, DefaultSkewWarning}, {&c.FlushTimeout, DefaultFlushTimeout},
		{&c.Heartbeat, DefaultHeartbeat}, {&c.MaxClockSkew, DefaultMaxClockSkew}, {&c.PingInterval, DefaultPingInterval},
	} {
		if *d.p < 0 {
			return fmt.Errorf("replicate: negative duration %v", *d.p)
		}
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	if c.EarlyGap == 0 {
		c.EarlyGap = c.SyncInterval / 10
	}
	if c.ShareDelay > counter.MaxShareDelay {
		return fmt.Errorf("replicate: ShareDelay %v above %v", c.ShareDelay, counter.MaxShareDelay)
	}
	if c.AntiEntropy == 0 {
		c.AntiEntropy = DefaultAntiEntropy
	}
	if c.MaxPeers < 0 || c.MaxPeers > 1<<16 {
		return fmt.Errorf("replicate: MaxPeers %d outside [0, 65536]", c.MaxPeers)
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	for _, n := range []struct {
		p    *int
		def  int
		name string
	}{
		{&c.SyncAnswersPerSecond, DefaultSyncAnswersPerSecond, "SyncAnswersPerSecond"},
		{&c.MaxMessageBytes, DefaultMaxMessageBytes, "MaxMessageBytes"},
	} {
		if *n.p < 0 {
			return fmt.Errorf("replicate: negative %s %d", n.name, *n.p)
		}
		if *n.p == 0 {
			*n.p = n.def
		}
	}
	if c.MaxMessageBytes < 1024 {
		return fmt.Errorf("replicate: MaxMessageBytes %d is below 1024", c.MaxMessageBytes)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}
