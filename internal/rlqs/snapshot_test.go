package rlqs

import (
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// The snapshot compiles the participants counts in the window they are
// counted in here.
func TestParticipantsWindowIsTheSnapshots(t *testing.T) {
	if ParticipantsWindow != snapshot.ParticipantsWindow {
		t.Fatalf("participants counted in %v, compiled in %v", ParticipantsWindow, snapshot.ParticipantsWindow)
	}
}
