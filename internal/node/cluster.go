package node

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/share"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Cluster is the cluster backend: counts replicated over NATS. Secrets
// (passwords, tokens, keys) come resolved; the node reads no environment
// and no secret file.
type Cluster struct {
	// URL is the NATS server URL, or several separated by commas.
	// Required.
	URL string
	// Options are nats.go's options for credentials and TLS.
	Options []nats.Option
	// NodeID names this node in its logs and its peers'; default the
	// host name. Processes are told apart by a random incarnation (see
	// replicate.Config.NodeID), so nodes may share a name.
	NodeID string
	// SubjectPrefix: batches on PREFIX.batch, warm-start requests on
	// PREFIX.sync; default replicate.DefaultSubjectPrefix.
	SubjectPrefix string
	// SyncInterval is how often the node publishes its changed counts;
	// default replicate.DefaultSyncInterval.
	SyncInterval time.Duration
	// WarmStartTimeout bounds the wait for the peers' counts before the
	// node reports ready; default replicate.DefaultWarmStartTimeout.
	WarmStartTimeout time.Duration
	// Keys are the cluster keys (replicate.KeySize bytes each; the first
	// seals, either opens); none: replication is neither authenticated
	// nor encrypted, and the node warns.
	Keys [][]byte
	// NoShares turns budget shares off: each node admits on its own view
	// up to the whole limit, and every changed count is replicated (see
	// docs/design/replication.md, "Budget shares").
	NoShares bool
}

func (c *Cluster) setDefaults() error {
	if c.URL == "" {
		return errors.New("node: the cluster backend needs a NATS URL")
	}
	if c.SyncInterval < 0 || c.WarmStartTimeout < 0 {
		return errors.New("node: the sync interval and the warm-start timeout must not be negative")
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = replicate.DefaultSubjectPrefix
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = replicate.DefaultSyncInterval
	}
	if c.WarmStartTimeout == 0 {
		c.WarmStartTimeout = replicate.DefaultWarmStartTimeout
	}
	return nil
}

// replicationBuckets are snap's buckets as replication follows them:
// every bucket of every source, by name, with its id, its algorithm and
// what a peer may report of it.
func replicationBuckets(snap *snapshot.Snapshot) []replicate.Bucket {
	bs := make([]replicate.Bucket, len(snap.Buckets))
	for i, b := range snap.Buckets {
		bs[i] = replicate.Bucket{Name: b.Name, ID: b.ID, Algorithm: b.Limit.Algorithm, Bounds: b.PeerBounds}
	}
	return bs
}

// newReplicator returns the replicator of the cluster backend, or nil for
// the local one (c nil), following snap's buckets.
func newReplicator(c *Cluster, snap *snapshot.Snapshot, store *counter.Store, reg prometheus.Registerer, log *slog.Logger) (*replicate.Replicator, error) {
	if c == nil {
		log.Info("counter backend: local (this node's counts only)")
		return nil, nil
	}
	repl, err := replicate.New(replicate.Config{
		URL: c.URL, Options: c.Options, NodeID: c.NodeID, Buckets: replicationBuckets(snap),
		SubjectPrefix: c.SubjectPrefix, SyncInterval: c.SyncInterval, WarmStartTimeout: c.WarmStartTimeout,
		Keys: c.Keys, ShareDelay: shareDelay(c.NoShares),
	}, store, reg, log)
	if err != nil {
		return nil, err
	}
	node, inc := repl.Identity()
	ids := make([]string, len(c.Keys))
	for i, k := range c.Keys {
		id := replicate.KeyID(k)
		ids[i] = hex.EncodeToString(id[:])
	}
	log.Info("counter backend: cluster (replicated over NATS)", "node", node, "incarnation", fmt.Sprintf("%016x", inc),
		"subject_prefix", c.SubjectPrefix, "sync_interval", c.SyncInterval.String(), "cluster_key_ids", strings.Join(ids, ","))
	if len(c.Keys) == 0 {
		log.Warn("no cluster key (RATELIMIT_AUTHZ_CLUSTER_KEY or --cluster-key-file): replication is neither authenticated nor encrypted; " +
			"whoever can publish on the NATS subjects can change counts, and whoever can subscribe reads every key (IPs, accounts, tenants)")
	}
	return repl, nil
}

// readyAfter is what readiness waits for: the replicator's warm start.
func readyAfter(repl *replicate.Replicator) []<-chan struct{} {
	if repl == nil {
		return nil
	}
	return []<-chan struct{}{repl.Ready()}
}

// runReplicator runs repl until the gRPC server has stopped, so that the
// final batch carries every check answered during the drain and graceful
// stop. A nil repl (local backend) returns at once.
func runReplicator(ctx context.Context, serverDone <-chan struct{}, repl *replicate.Replicator) error {
	if repl == nil {
		return nil
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- repl.Run(rctx) }()
	select {
	case err := <-errc: // options nats.go refused
		return err
	case <-serverDone:
		cancel()
		return <-errc
	}
}

// shareDelay is replicate.Config.ShareDelay for Cluster.NoShares: its
// default, or share.Off.
func shareDelay(noShares bool) time.Duration {
	if noShares {
		return share.Off
	}
	return 0
}
