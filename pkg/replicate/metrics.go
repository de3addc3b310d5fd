package replicate

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons an entry is dropped (label reason of entries_dropped_total).
const (
	dropStale         = "stale"          // received for a window that has ended
	dropStaleLocal    = "stale_local"    // own change whose window ended before it was sent
	dropUnknownBucket = "unknown_bucket" // bucket name not in this node's configuration
	dropMismatch      = "mismatch"       // key counted here in another window length
	dropRefused       = "refused"        // no room: key bound or peers per key
	dropInvalid       = "invalid"        // out-of-range values, or an origin that is this node
	dropDeferred      = "deferred"       // a count for the next window that could not be kept for later
	dropTooLarge      = "too_large"      // an own entry larger than one message
	dropUnknownPeer   = "unknown_peer"   // from a peer over the peer bound
	dropScale         = "scale"          // a window length no limit of the bucket has on this node
)

// Reasons a message is dropped (label reason of messages_malformed_total).
const (
	malDecode   = "decode"             // cannot be read
	malVersion  = "version"            // another wire version
	malOversize = "oversize"           // larger than MaxMessageBytes
	malKind     = "kind"               // a known kind on the wrong subject, or a sync request without a reply subject
	malSelf     = "self"               // claims to come from this very process
	malUnsealed = "unsealed"           // not sealed, and this node has a cluster key
	malNoKey    = "sealed_without_key" // sealed, and this node has no cluster key
	malUnknown  = "unknown_key"        // sealed with a key this node does not hold
	malAuth     = "unauthentic"        // does not open: altered, truncated, forged, or sealed for another use
	malClock    = "clock"              // sent at a time further from this node's clock than MaxClockSkew
)

// Reasons a sync request is not answered (label reason of
// sync_requests_refused_total).
const (
	refusedRate  = "rate"  // over SyncAnswersPerSecond
	refusedReply = "reply" // no reply subject, or one that is not an _INBOX. subject
)

type metrics struct {
	batchesSent, entriesSent           prometheus.Counter
	earlyBatches                       prometheus.Counter
	batchesReceived, entriesReceived   prometheus.Counter
	entriesMerged                      prometheus.Counter
	dropped                            map[string]prometheus.Counter
	malformed                          map[string]prometheus.Counter
	batchesMissed, batchesRepeated     prometheus.Counter
	publishErrors                      prometheus.Counter
	publishDuration                    prometheus.Histogram
	peersRefused                       prometheus.Counter
	syncServed, syncMerged, syncFailed prometheus.Counter
	syncRefused                        map[string]prometheus.Counter
	clamped                            prometheus.Counter
	panics                             prometheus.Counter
	slowConsumer                       prometheus.Counter
	heartbeats                         prometheus.Counter
	antiEntropy                        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, gauges func(ns, sub string) []prometheus.Collector) (*metrics, error) {
	const ns, sub = "ratelimit_authz", "replicate"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "entries_dropped_total",
		Help: "Replicated counts not merged or not sent, by reason.",
	}, []string{"reason"})
	malformed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "messages_malformed_total",
		Help: "Messages dropped unread, by reason.",
	}, []string{"reason"})
	m := &metrics{
		batchesSent:     counter("batches_sent_total", "Batch messages published (one per sync interval with changes, more only when split, plus early ones)."),
		earlyBatches:    counter("early_batches_sent_total", "Batch messages published between ticks because a local hit left a key near its limit (one publish per early gap at most)."),
		entriesSent:     counter("entries_sent_total", "Counts published in batches."),
		batchesReceived: counter("batches_received_total", "Batch messages received from peers and read."),
		entriesReceived: counter("entries_received_total", "Counts received in batches and sync replies."),
		entriesMerged:   counter("entries_merged_total", "Received counts that raised a peer's count here."),
		batchesMissed:   counter("batches_missed_total", "Gaps in peers' batch numbers: batches lost (repaired by the next one that carries the same keys)."),
		batchesRepeated: counter("batches_repeated_total", "Peers' batches received again or out of order (merged by max, so harmless)."),
		publishErrors:   counter("publish_errors_total", "Batch messages that could not be published."),
		publishDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "publish_duration_seconds",
			Help:    "Time to collect, encode and publish one interval's batch.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}),
		peersRefused: counter("peers_refused_total", "Messages from a new peer dropped because max_peers peers are known."),
		syncServed:   counter("sync_replies_sent_total", "Sync requests (warm starts, reconnects) answered."),
		syncMerged:   counter("sync_entries_merged_total", "Counts merged from sync replies."),
		syncFailed:   counter("sync_requests_failed_total", "Sync requests of this node that got no complete reply before their deadline."),
		clamped:      counter("entries_clamped_total", "Received counts above what a limit of their bucket on this node allows, lowered to that bound."),
		panics:       counter("callback_panics_total", "Panics recovered in a NATS message handler (a bug: the message is dropped, the node keeps running)."),
		slowConsumer: counter("slow_consumer_events_total", "Messages the NATS client dropped because this node read too slowly (followed by a resync)."),
		heartbeats:   counter("heartbeats_sent_total", "Empty batches published because nothing changed for a heartbeat interval (peers see the node alive)."),
		antiEntropy:  counter("anti_entropy_entries_sent_total", "Unchanged live counts published again in the background (repairs a lost batch of a quiet key)."),
		dropped:      map[string]prometheus.Counter{},
		malformed:    map[string]prometheus.Counter{},
		syncRefused:  map[string]prometheus.Counter{},
	}
	syncRefused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "sync_requests_refused_total",
		Help: "Sync requests read but not answered, by reason.",
	}, []string{"reason"})
	for _, r := range []string{refusedRate, refusedReply} {
		m.syncRefused[r] = syncRefused.WithLabelValues(r)
	}
	for _, r := range []string{dropStale, dropStaleLocal, dropUnknownBucket, dropMismatch, dropRefused, dropInvalid, dropDeferred, dropTooLarge, dropUnknownPeer, dropScale} {
		m.dropped[r] = dropped.WithLabelValues(r)
	}
	for _, r := range []string{malDecode, malVersion, malOversize, malKind, malSelf, malUnsealed, malNoKey, malUnknown, malAuth, malClock} {
		m.malformed[r] = malformed.WithLabelValues(r)
	}
	cs := []prometheus.Collector{
		m.batchesSent, m.earlyBatches, m.entriesSent, m.batchesReceived, m.entriesReceived, m.entriesMerged,
		dropped, malformed, m.batchesMissed, m.batchesRepeated, m.publishErrors, m.publishDuration,
		m.peersRefused, m.syncServed, m.syncMerged, m.syncFailed, syncRefused,
		m.clamped, m.panics, m.slowConsumer, m.heartbeats, m.antiEntropy,
	}
	cs = append(cs, gauges(ns, sub)...)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("replicate: register metrics: %w", err)
		}
	}
	return m, nil
}
