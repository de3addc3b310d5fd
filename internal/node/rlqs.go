package node

import (
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlqs"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rules"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
)

// The rate limit quota service (RLQS) part of a generation: the rules
// file's quota section, served by rlqs.Service when the file has one.
// Each bucket the section maps has a participants count of its own (see
// rlqs.ParticipantsWindow), replicated like the buckets' counts under the
// name rlqsParticipantsPrefix + bucket name (a "/" no bucket name has).

const rlqsParticipantsPrefix = "rlqs/participants/"

// quotaBuckets are the buckets (by index) the quota section maps, each
// once, in the order the section first names them; nil without one.
func quotaBuckets(r *rules.Rules) []int {
	if r.Quota == nil {
		return nil
	}
	var out []int
	seen := map[int]bool{}
	for _, e := range r.Quota.Buckets {
		if b := int(e.Bucket); !seen[b] {
			seen[b] = true
			out = append(out, b)
		}
	}
	return out
}

// quotaKeys are the participants counts' ids to plan, in quotaBuckets'
// order.
func quotaKeys(r *rules.Rules) []wiring.BucketKey {
	var ks []wiring.BucketKey
	for _, b := range quotaBuckets(r) {
		ks = append(ks, wiring.BucketKey{
			Name:      rlqsParticipantsPrefix + r.Buckets[b].Name,
			ScaleMS:   rlqs.ParticipantsLimit.ScaleMS,
			Algorithm: counter.Fixed,
		})
	}
	return ks
}

// quotaPeerBounds is what a peer may report of the participants counts: at
// most one participant per stream, and a node serves at most max_streams
// (the nodes of a cluster share one rules file). A larger count is
// clamped: a forged one can shrink shares, never enlarge them.
func quotaPeerBounds(r *rules.Rules) replicate.BucketWindows {
	var w replicate.BucketWindows
	for range quotaBuckets(r) {
		w = append(w, map[int64]int64{rlqs.ParticipantsLimit.ScaleMS: int64(r.Quota.MaxStreams)})
	}
	return w
}

// rlqsConfig is the RLQS service's configuration of the generation.
func (g *generation) rlqsConfig() rlqs.Config {
	r := g.rules
	c := rlqs.Config{Quota: r.Quota, Limits: g.limits, Buckets: make([]rlqs.Bucket, len(r.Buckets))}
	for i, b := range r.Buckets {
		c.Buckets[i] = rlqs.Bucket{
			Name: b.Name, ID: g.authz.IDs[i], Shadow: b.Shadow,
			DenyMissingKey: b.OnMissingKey == rules.Deny, DenyOverflow: b.OnOverflow == rules.Deny,
		}
	}
	for j, b := range quotaBuckets(r) {
		c.Buckets[b].Participants, c.Buckets[b].HasParticipants = g.quotaIDs[j], true
	}
	return c
}

// rlqsOptions are the RLQS service's options: on a cluster node, the live
// nodes as the replicator counts them, and two replication intervals for
// the participants that join at once on several nodes to be known.
func rlqsOptions(c *Cluster, repl *replicate.Replicator) rlqs.Options {
	if c == nil || repl == nil {
		return rlqs.Options{}
	}
	return rlqs.Options{Nodes: repl.Nodes, Settle: 2 * c.SyncInterval}
}
