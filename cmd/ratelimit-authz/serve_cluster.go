package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

// Backends of --backend / RATE_LIMIT_BACKEND.
const (
	backendLocal   = "local"   // counts on this node only
	backendCluster = "cluster" // counts replicated over NATS
)

// clusterConfig is the serve flags of the cluster backend.
type clusterConfig struct {
	backend          string
	natsURL          string
	natsCreds        string
	natsNkey         string
	natsUser         string
	natsPassword     string // environment or file only
	natsToken        string // environment or file only
	natsPasswordFile string
	natsTokenFile    string
	clusterKeyFile   string
	clusterKeys      [][]byte // environment or file only
	natsCA           string
	natsCert         string
	natsKey          string
	syncInterval     time.Duration
	subjectPrefix    string
	warmStartTimeout time.Duration
	nodeID           string
}

func (c *clusterConfig) addFlags(f *envFlags) {
	f.String(&c.backend, "backend", "RATE_LIMIT_BACKEND", "", "counter `backend`: local (this node's counts) or cluster (replicated over NATS); default cluster when a NATS URL is set, else local")
	f.String(&c.natsURL, "nats-url", "NATS_URL", "", "NATS server `URL`s, comma-separated (cluster backend)")
	f.String(&c.natsCreds, "nats-creds", "NATS_CREDS", "", "NATS user credentials `file` (JWT and seed)")
	f.String(&c.natsNkey, "nats-nkey", "NATS_NKEY", "", "NATS NKey seed `file`")
	f.String(&c.natsUser, "nats-user", "NATS_USER", "", "NATS `user`; the password comes from NATS_PASSWORD or --nats-password-file")
	f.String(&c.natsPasswordFile, "nats-password-file", "NATS_PASSWORD_FILE", "", "`file` holding the NATS password (instead of NATS_PASSWORD)")
	f.String(&c.natsTokenFile, "nats-token-file", "NATS_TOKEN_FILE", "", "`file` holding a NATS token (instead of NATS_TOKEN)")
	f.String(&c.clusterKeyFile, "cluster-key-file", "RATELIMIT_AUTHZ_CLUSTER_KEY_FILE", "", "`file` holding the cluster key that seals replication (32 bytes, base64 or hex; a second line: the previous key, still accepted); or the key itself in RATELIMIT_AUTHZ_CLUSTER_KEY")
	f.String(&c.natsCA, "nats-tls-ca", "NATS_CA", "", "`file` of CA certificates to verify the NATS server (turns TLS on)")
	f.String(&c.natsCert, "nats-tls-cert", "NATS_CERT", "", "client certificate `file` for NATS mutual TLS (with --nats-tls-key)")
	f.String(&c.natsKey, "nats-tls-key", "NATS_KEY", "", "client key `file` for NATS mutual TLS")
	f.Duration(&c.syncInterval, "sync-interval", "RATELIMIT_AUTHZ_SYNC_INTERVAL", replicate.DefaultSyncInterval, "how often a node publishes its changed counts (cluster backend)")
	f.String(&c.subjectPrefix, "nats-subject-prefix", "RATELIMIT_AUTHZ_NATS_SUBJECT_PREFIX", replicate.DefaultSubjectPrefix, "NATS subject `prefix`: batches on PREFIX.batch, warm-start requests on PREFIX.sync")
	f.Duration(&c.warmStartTimeout, "warm-start-timeout", "RATELIMIT_AUTHZ_WARM_START_TIMEOUT", replicate.DefaultWarmStartTimeout, "longest wait for peers' counts before reporting ready (cluster backend)")
	f.String(&c.nodeID, "node-id", "RATELIMIT_AUTHZ_NODE_ID", "", "this node's `name` to its peers (metrics, logs); default the host name")
}

// resolve reads the secrets from the environment or files (never flags:
// ps would show them), picks the backend and checks the combination. Its
// errors are usage errors.
func (c *clusterConfig) resolve(getenv func(string) string) error {
	var err error
	if c.natsPassword, err = secret(getenv, "NATS_PASSWORD", "--nats-password-file", c.natsPasswordFile); err != nil {
		return err
	}
	if c.natsToken, err = secret(getenv, "NATS_TOKEN", "--nats-token-file", c.natsTokenFile); err != nil {
		return err
	}
	keys, err := secret(getenv, "RATELIMIT_AUTHZ_CLUSTER_KEY", "--cluster-key-file", c.clusterKeyFile)
	if err != nil {
		return err
	}
	c.clusterKeys = nil
	if keys != "" {
		if c.clusterKeys, err = replicate.ParseKeys(keys); err != nil {
			from := "RATELIMIT_AUTHZ_CLUSTER_KEY"
			if c.clusterKeyFile != "" {
				from = "--cluster-key-file " + c.clusterKeyFile
			}
			return fmt.Errorf("%s: %w", from, err)
		}
	}
	switch c.backend {
	case "":
		c.backend = backendLocal
		if c.natsURL != "" {
			c.backend = backendCluster
		}
	case backendLocal:
	case backendCluster:
		if c.natsURL == "" {
			return errors.New("--backend cluster needs --nats-url (or NATS_URL)")
		}
	default:
		return fmt.Errorf("--backend %q: use local or cluster", c.backend)
	}
	if c.backend != backendCluster {
		return nil
	}
	if c.syncInterval <= 0 {
		return errors.New("--sync-interval must be positive")
	}
	if c.warmStartTimeout <= 0 {
		return errors.New("--warm-start-timeout must be positive")
	}
	if (c.natsCert == "") != (c.natsKey == "") {
		return errors.New("--nats-tls-cert and --nats-tls-key go together")
	}
	if c.natsUser != "" && c.natsToken != "" {
		return errors.New("NATS user and NATS_TOKEN exclude each other")
	}
	for flag, path := range map[string]string{
		"--nats-creds": c.natsCreds, "--nats-nkey": c.natsNkey, "--nats-tls-ca": c.natsCA,
		"--nats-tls-cert": c.natsCert, "--nats-tls-key": c.natsKey,
	} {
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		}
	}
	return nil
}

// secret reads a secret from the environment variable env or from file
// (named by flag), not both. A file's content is trimmed of surrounding
// white space.
func secret(getenv func(string) string, env, flag, file string) (string, error) {
	v := getenv(env)
	if file == "" {
		return v, nil
	}
	if v != "" {
		return "", fmt.Errorf("%s and %s exclude each other", env, flag)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	v = strings.TrimSpace(string(b))
	if v == "" {
		return "", fmt.Errorf("%s %s: empty file", flag, file)
	}
	return v, nil
}

func (c *clusterConfig) cluster() bool { return c.backend == backendCluster }

// counterConfig is the counter's configuration for the backend: the
// cluster backend tracks this node's changes for replication.
func (c *clusterConfig) counterConfig(cfg counter.Config) counter.Config {
	cfg.Track = c.cluster()
	return cfg
}

// natsOptions turns the credential and TLS flags into nats.go options.
func (c *clusterConfig) natsOptions() ([]nats.Option, error) {
	var opts []nats.Option
	if c.natsCreds != "" {
		opts = append(opts, nats.UserCredentials(c.natsCreds))
	}
	if c.natsNkey != "" {
		o, err := nats.NkeyOptionFromSeed(c.natsNkey)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey %s: %w", c.natsNkey, err)
		}
		opts = append(opts, o)
	}
	if c.natsUser != "" {
		opts = append(opts, nats.UserInfo(c.natsUser, c.natsPassword))
	}
	if c.natsToken != "" {
		opts = append(opts, nats.Token(c.natsToken))
	}
	if c.natsCA != "" {
		opts = append(opts, nats.RootCAs(c.natsCA))
	}
	if c.natsCert != "" {
		opts = append(opts, nats.ClientCert(c.natsCert, c.natsKey))
	}
	return opts, nil
}

// newReplicator returns the replicator of the cluster backend, or nil for
// the local one.
func newReplicator(c *clusterConfig, r *rules.Rules, store *counter.Store, reg prometheus.Registerer, log *slog.Logger) (*replicate.Replicator, error) {
	if !c.cluster() {
		log.Info("counter backend: local (this node's counts only)")
		return nil, nil
	}
	opts, err := c.natsOptions()
	if err != nil {
		return nil, err
	}
	buckets := make([]string, len(r.Buckets))
	for i, b := range r.Buckets {
		buckets[i] = b.Name
	}
	repl, err := replicate.New(replicate.Config{
		URL: c.natsURL, Options: opts, Buckets: buckets, NodeID: c.nodeID,
		SubjectPrefix: c.subjectPrefix, SyncInterval: c.syncInterval, WarmStartTimeout: c.warmStartTimeout,
		Keys: c.clusterKeys, Bounds: peerBounds(r),
	}, store, reg, log)
	if err != nil {
		return nil, err
	}
	node, inc := repl.Identity()
	ids := make([]string, len(c.clusterKeys))
	for i, k := range c.clusterKeys {
		id := replicate.KeyID(k)
		ids[i] = hex.EncodeToString(id[:])
	}
	log.Info("counter backend: cluster (replicated over NATS)", "node", node, "incarnation", fmt.Sprintf("%016x", inc),
		"subject_prefix", c.subjectPrefix, "sync_interval", c.syncInterval.String(), "cluster_key_ids", strings.Join(ids, ","))
	if len(c.clusterKeys) == 0 {
		log.Warn("no cluster key (RATELIMIT_AUTHZ_CLUSTER_KEY or --cluster-key-file): replication is neither authenticated nor encrypted; " +
			"whoever can publish on the NATS subjects can change counts, and whoever can subscribe reads every key (IPs, accounts, tenants)")
	}
	return repl, nil
}

// peerBounds is what a peer may report per bucket: the window lengths of
// the bucket's limits on this node (its own, every route default, the
// built-in one) with limit × replicate.PeerCountFactor, and for an
// overridable bucket every window a tenant override can have
// (tenantlimits.Scales), with any count an override allows.
func peerBounds(r *rules.Rules) replicate.BucketWindows {
	w := make(replicate.BucketWindows, len(r.Buckets))
	limits := tenantlimits.NewResolver(wiring.Limits(r), nil)
	for i := range r.Buckets {
		m := map[int64]int64{}
		add := func(l counter.Limit) { m[l.ScaleMS] = max(m[l.ScaleMS], replicate.BoundFor(l.Limit)) }
		if l, ok := limits.Configured(counter.Bucket(i)); ok {
			add(l)
		}
		if r.Buckets[i].Overridable {
			for _, sc := range tenantlimits.Scales {
				add(counter.Limit{Limit: counter.MaxLimit, ScaleMS: sc.MS})
			}
		}
		w[i] = m
	}
	return w
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
