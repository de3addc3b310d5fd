package replicate

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// TestPeersListsTheOthers: each of three nodes lists the two others, by
// identity, heard from lately, and none lists itself.
func TestPeersListsTheOthers(t *testing.T) {
	srv := testnats.Run(t)
	var nodes []*live
	for i := range 3 {
		nodes = append(nodes, startLive(t, srv.ClientURL(), fmt.Sprintf("n%d", i), Config{}, nodeOpts{}))
	}
	for _, nd := range nodes {
		nd.waitReady(t)
	}
	for i, nd := range nodes {
		poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
			ps := nd.r.Peers()
			var want []string
			for j, o := range nodes {
				if j != i {
					id, inc := o.r.Identity()
					want = append(want, fmt.Sprintf("%s/%d", id, inc))
				}
			}
			var got []string
			for _, p := range ps {
				if p.LastHeard.IsZero() || time.Since(p.LastHeard) > 10*time.Second {
					return fmt.Errorf("%s: peer %+v not heard from lately", nd.id, p)
				}
				got = append(got, fmt.Sprintf("%s/%d", p.Node, p.Incarnation))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("%s lists %v, want %v", nd.id, got, want)
			}
			return nil
		})
		if nd.r.Sealed() {
			t.Errorf("%s: sealed without a cluster key", nd.id)
		}
	}
}
