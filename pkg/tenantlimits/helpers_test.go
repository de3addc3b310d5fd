package tenantlimits_test

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
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

func shippedRules(t testing.TB) *rules.Rules {
	t.Helper()
	r, err := rules.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// env is a migrated throwaway database and a connection to it.
type env struct {
	pg    *testpg.Server
	url   string
	conn  *pgx.Conn
	rules *rules.Rules
	ctx   context.Context
}

func setup(t *testing.T) *env {
	t.Helper()
	pg := testpg.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	e := &env{pg: pg, url: pg.URL(), rules: shippedRules(t), ctx: ctx}
	e.conn = e.connect(t)
	if _, err := tenantlimits.Migrate(ctx, e.conn); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) connect(t *testing.T) *pgx.Conn {
	t.Helper()
	return testpg.Connect(t, e.url)
}

func (e *env) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.conn.Exec(e.ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.conn.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// running is a Cache under Run, with its registry and log.
type running struct {
	*tenantlimits.Cache
	reg  *prometheus.Registry
	logs *logbuf.Buffer
	stop func()
}

// startCache creates a cache with fast test timings (unless cfg sets them),
// loads it and runs it until the test ends; stop ends it early and checks
// that Run returns.
func startCache(t *testing.T, e *env, cfg tenantlimits.Config) *running {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = e.url
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
	c, err := tenantlimits.NewCache(cfg, wiring.Limits(e.rules, nil), reg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c.Load(e.ctx) // may fail (Postgres down at start): Run retries
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
