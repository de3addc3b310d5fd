// Package snapshottest compiles snapshots for tests that read the counter
// by a bucket's index.
package snapshottest

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
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
