package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ratelimit-authz/ratelimit-authz/internal/node"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
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
	budgetShares     bool
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
	f.String(&c.subjectPrefix, "nats-subject-prefix", "RATELIMIT_AUTHZ_NATS_SUBJECT_PREFIX", replicate.DefaultSubjectPrefix, "NATS subject `prefix`: batches on PREFIX.batch, warm-start requests on PREFIX.sync, the admin listener's cluster queries on PREFIX.query, in-flight gauges and releases on PREFIX.cast")
	f.Duration(&c.warmStartTimeout, "warm-start-timeout", "RATELIMIT_AUTHZ_WARM_START_TIMEOUT", replicate.DefaultWarmStartTimeout, "longest wait for peers' counts before reporting ready (cluster backend)")
	f.String(&c.nodeID, "node-id", "RATELIMIT_AUTHZ_NODE_ID", "", "this node's `name` in its logs and its peers' (cluster backend); default the host name. Each process is told apart by a random incarnation, so nodes that share a name still split budgets; a name several live processes claim is logged and counted")
	f.Bool(&c.budgetShares, "budget-shares", "RATELIMIT_AUTHZ_BUDGET_SHARES", true, "split each key's budget between the live nodes: a node admits up to its share without waiting for its peers' counts and replicates only keys near their share (cluster backend; false: each node admits on its own view up to the whole limit and replicates every change)")
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
// (named by flag), not both; a file as readSecretFile reads it.
func secret(getenv func(string) string, env, flag, file string) (string, error) {
	v := getenv(env)
	if file == "" {
		return v, nil
	}
	if v != "" {
		return "", fmt.Errorf("%s and %s exclude each other", env, flag)
	}
	v, err := readSecretFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	return v, nil
}

func (c *clusterConfig) cluster() bool { return c.backend == backendCluster }

// nodeCluster is the node's cluster configuration, nil for the local
// backend. The NATS credentials are read here (an NKey seed file at once).
func (c *clusterConfig) nodeCluster() (*node.Cluster, error) {
	if !c.cluster() {
		return nil, nil
	}
	opts, err := c.natsOptions()
	if err != nil {
		return nil, err
	}
	return &node.Cluster{
		URL: c.natsURL, Options: opts, NodeID: c.nodeID,
		SubjectPrefix: c.subjectPrefix, SyncInterval: c.syncInterval, WarmStartTimeout: c.warmStartTimeout,
		Keys: c.clusterKeys, NoShares: !c.budgetShares,
	}, nil
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
