package overrides_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

func shippedRules(t testing.TB) *configfile.Rules {
	t.Helper()
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// env is a migrated throwaway database, a connection to it and the
// shipped configuration.
type env struct {
	*testpg.DB
	rules *configfile.Rules
}

func setup(t *testing.T) *env {
	t.Helper()
	return &env{DB: testpg.StartDB(t, migrate), rules: shippedRules(t)}
}

func migrate(ctx context.Context, conn *pgx.Conn) error {
	_, err := overridedb.Migrate(ctx, conn)
	return err
}

// running is a Cache under Run, with its registry and log.
type running struct {
	*overrides.Cache
	reg  *prometheus.Registry
	logs *logbuf.Buffer
	stop func()
}

// startCache creates a cache with fast test timings (unless cfg sets them),
// loads it and runs it until the test ends; stop ends it early and checks
// that Run returns.
func startCache(t *testing.T, e *env, cfg overrides.Config) *running {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = e.URL
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 5 * time.Second
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 50 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 300 * time.Millisecond
	}
	reg := prometheus.NewRegistry()
	logs := &logbuf.Buffer{}
	c, err := overrides.NewCache(cfg, snapshottest.ByIndex(t, e.rules), reg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c.Load(e.Ctx) // may fail (Postgres down at start): Run retries
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return after its context ended; log:\n%s", logs)
			}
		})
	}
	t.Cleanup(stop)
	return &running{Cache: c, reg: reg, logs: logs, stop: stop}
}

// metric returns the value of a gauge, counter or histogram with the given
// labels (name, value pairs); the series must exist.
func metric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	return scrape.Must(t, reg, name, labels...)
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
