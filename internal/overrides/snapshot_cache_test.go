package overrides_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// TestSnapshotFileWhenPostgresIsAway: a cache that loaded from Postgres
// leaves a snapshot file; one started while Postgres is down serves it
// (and says so), one with a damaged file serves none (and says so), and
// both go back to Postgres when it returns.
func TestSnapshotFileWhenPostgresIsAway(t *testing.T) {
	e := setup(t)
	inb, upl := counter.Bucket(e.rules.BucketIndex("inbound")), counter.Bucket(e.rules.BucketIndex("upload"))
	s, err := overridedb.NewStore(e.Conn, snapshottest.ByIndex(t, e.rules))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(e.Ctx, "bigco", limits.Override{Bucket: "inbound", Limit: 5000, ScaleMS: 1000}, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetOwner(e.Ctx, "channel", "ch-1", "bigco", "alice"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "overrides.snapshot")
	first := startCache(t, e, overrides.Config{SnapshotFile: path})
	if st := first.State(); !strings.HasPrefix(st, "overrides: postgres, current (1 overrides, 1 key owners)") {
		t.Errorf("state %q", st)
	}
	if got := metric(t, first.reg, "ratelimit_authz_overrides_source", "source", "postgres"); got != 1 {
		t.Errorf("source postgres %v", got)
	}
	// A change is written to the file too.
	if _, err := s.Set(e.Ctx, "small", limits.Override{Bucket: "upload", Limit: 3, ScaleMS: 1000}, "alice"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 2*time.Second, 10*time.Millisecond, func() error {
		b, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(b), "small\tupload\t3\t1000") {
			return fmt.Errorf("snapshot file lacks the change: %v\n%s", err, b)
		}
		return nil
	})
	first.stop()
	good, _ := os.ReadFile(path)

	e.Server.Stop(t)
	down := startCache(t, e, overrides.Config{SnapshotFile: path})
	if got, ok := down.OverrideFor(inb, "ch-1"); !ok || got != lim(5000, 1000) {
		t.Errorf("from the file: channel ch-1 %+v %v", got, ok)
	}
	if got, ok := down.Override("small", upl); !ok || got != lim(3, 1000) {
		t.Errorf("from the file: small %+v %v", got, ok)
	}
	if got := metric(t, down.reg, "ratelimit_authz_overrides_source", "source", "snapshot"); got != 1 {
		t.Errorf("source snapshot %v", got)
	}
	if got := metric(t, down.reg, "ratelimit_authz_overrides_degraded"); got != 1 {
		t.Errorf("degraded %v", got)
	}
	if st := down.State(); !contains(st, "overrides: snapshot file "+path, "(2 overrides, 1 key owners)", "Postgres cannot be reached") {
		t.Errorf("state %q", st)
	}
	if !contains(down.logs.String(), "serving the snapshot file until Postgres answers") {
		t.Errorf("log:\n%s", down.logs)
	}

	// Damaged files: rejected whole, counted, logged; none served.
	for i, damaged := range [][]byte{good[:len(good)/2], append([]byte("x"), good[1:]...)} {
		if err := os.WriteFile(path, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		bad := startCache(t, e, overrides.Config{SnapshotFile: path})
		if _, ok := bad.OverrideFor(inb, "ch-1"); ok {
			t.Errorf("damaged file %d: an override is served", i)
		}
		if got := metric(t, bad.reg, "ratelimit_authz_overrides_snapshot_file_errors_total", "op", "read"); got != 1 {
			t.Errorf("damaged file %d: read errors %v", i, got)
		}
		if got := metric(t, bad.reg, "ratelimit_authz_overrides_source", "source", "none"); got != 1 {
			t.Errorf("damaged file %d: source none %v", i, got)
		}
		if st := bad.State(); !strings.HasPrefix(st, "overrides: none") {
			t.Errorf("damaged file %d: state %q", i, st)
		}
		if !contains(bad.logs.String(), "snapshot file is rejected", "bad overrides snapshot file") {
			t.Errorf("damaged file %d: log:\n%s", i, bad.logs)
		}
		bad.stop()
	}

	// Postgres returns: the node that served the file switches to it.
	e.Server.Start(t)
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := metric(t, down.reg, "ratelimit_authz_overrides_source", "source", "postgres"); got != 1 {
			return fmt.Errorf("source postgres %v; state %q", got, down.State())
		}
		return nil
	})
	if got, ok := down.OverrideFor(inb, "ch-1"); !ok || got != lim(5000, 1000) {
		t.Errorf("back on Postgres: channel ch-1 %+v %v", got, ok)
	}
	if _, ok := down.OverrideFor(inb, "ch-2"); ok {
		t.Error("an unowned channel has an override")
	}
	// and rewrites the damaged file.
	poll.Until(t, 2*time.Second, 10*time.Millisecond, func() error {
		if b, _ := os.ReadFile(path); !strings.Contains(string(b), "O\tchannel\tch-1\tbigco\n") || !strings.HasPrefix(string(b), "ratelimit-authz overrides snapshot v1\n") {
			return fmt.Errorf("snapshot file not rewritten:\n%s", b)
		}
		return nil
	})
}
