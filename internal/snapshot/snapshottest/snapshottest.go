// Package snapshottest compiles snapshots for tests: the rules file's
// with each bucket's index as its counter id, and an envoyproxy/ratelimit
// directory's beside a rules file of one bucket.
package snapshottest

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// ByIndex is the snapshot of r with each bucket's position as its counter
// id (a rules bucket its index; see snapshot.ByPosition), failing t when
// it does not compile.
func ByIndex(t testing.TB, r *configfile.Rules) *snapshot.Snapshot {
	t.Helper()
	snap, err := snapshot.CompileWith(snapshot.Sources{Rules: r}, snapshot.ByPosition())
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// oneBucket is the least rules file a snapshot compiles from.
const oneBucket = `buckets:
  snapshottest: {limit: 1, per: 1s, key: ip}
routes:
  - {method: GET, path: /snapshottest, buckets: [snapshottest]}
`

// RLS is the snapshot of c (its buckets' ids as a node gives them) beside
// a rules file of one bucket, named snapshottest, failing t when it does
// not compile: what a test of ShouldRateLimit serves.
func RLS(t testing.TB, c *rlsconfig.Config) *snapshot.Snapshot {
	t.Helper()
	r, err := configfile.Parse([]byte(oneBucket), "snapshottest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	snap, err := snapshot.Compile(snapshot.Sources{Rules: r, RLS: c})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}
