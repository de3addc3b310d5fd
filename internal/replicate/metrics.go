package replicate

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// dropReasons are the children of entries_dropped_total: entries not
// merged or not sent, one counter per reason (its label in reasons).
type dropReasons struct {
	stale         prometheus.Counter // received for a window that has ended
	staleLocal    prometheus.Counter // own change whose window ended before it was sent
	unknownBucket prometheus.Counter // bucket name not in this node's configuration
	mismatch      prometheus.Counter // key counted here in another window length
	refused       prometheus.Counter // no room: key bound or peers per key
	invalid       prometheus.Counter // out-of-range values, or an origin that is this node
	deferred      prometheus.Counter // a count for the next window that could not be kept for later
	tooLarge      prometheus.Counter // an own entry larger than one message
	unknownPeer   prometheus.Counter // from a peer over the peer bound
	scale         prometheus.Counter // a window length no limit of the bucket has on this node
	algorithm     prometheus.Counter // counted in another algorithm than the bucket's here
}

func (d *dropReasons) reasons() []reason {
	return []reason{
		{"stale", &d.stale}, {"stale_local", &d.staleLocal}, {"unknown_bucket", &d.unknownBucket},
		{"mismatch", &d.mismatch}, {"refused", &d.refused}, {"invalid", &d.invalid},
		{"deferred", &d.deferred}, {"too_large", &d.tooLarge}, {"unknown_peer", &d.unknownPeer},
		{"scale", &d.scale}, {"algorithm", &d.algorithm},
	}
}

// malformedReasons are the children of messages_malformed_total: messages
// dropped unread, one counter per reason.
type malformedReasons struct {
	decode     prometheus.Counter // cannot be read
	version    prometheus.Counter // another wire version
	oversize   prometheus.Counter // larger than MaxMessageBytes
	kind       prometheus.Counter // a known kind on the wrong subject, or a sync request without a reply subject
	self       prometheus.Counter // claims to come from this very process
	unsealed   prometheus.Counter // not sealed, and this node has a cluster key
	noKey      prometheus.Counter // sealed, and this node has no cluster key
	unknownKey prometheus.Counter // sealed with a key this node does not hold
	auth       prometheus.Counter // does not open: altered, truncated, forged, or sealed for another use
	clock      prometheus.Counter // sent at a time further from this node's clock than MaxClockSkew
	replayed   prometheus.Counter // a cast numbered at or below the last one delivered from its sender
}

func (m *malformedReasons) reasons() []reason {
	return []reason{
		{"decode", &m.decode}, {"version", &m.version}, {"oversize", &m.oversize}, {"kind", &m.kind},
		{"self", &m.self}, {"unsealed", &m.unsealed}, {"sealed_without_key", &m.noKey},
		{"unknown_key", &m.unknownKey}, {"unauthentic", &m.auth}, {"clock", &m.clock},
		{"replayed", &m.replayed},
	}
}

// refusedReasons are the children of sync_requests_refused_total: sync
// requests read but not answered.
type refusedReasons struct {
	rate  prometheus.Counter // over SyncAnswersPerSecond
	reply prometheus.Counter // no reply subject, or one that is not an _INBOX. subject
}

func (r *refusedReasons) reasons() []reason {
	return []reason{{"rate", &r.rate}, {"reply", &r.reply}}
}

// reason is one child of a counter vector by reason: its label, and the
// typed field it is bound to.
type reason struct {
	label string
	c     *prometheus.Counter
}

// bind creates every child of vec in rs (all series exist from the start,
// at 0) and stores each in its field.
func bind(vec *prometheus.CounterVec, rs []reason) {
	for _, r := range rs {
		*r.c = vec.WithLabelValues(r.label)
	}
}

// metrics are the Replicator's metrics; every child is created by
// newMetrics, so no field is ever nil.
type metrics struct {
	batchesSent, entriesSent           prometheus.Counter
	earlyBatches                       prometheus.Counter
	batchesReceived, entriesReceived   prometheus.Counter
	entriesMerged                      prometheus.Counter
	dropped                            dropReasons
	malformed                          malformedReasons
	batchesMissed, batchesRepeated     prometheus.Counter
	publishErrors                      prometheus.Counter
	publishDuration                    prometheus.Histogram
	peersRefused                       prometheus.Counter
	syncServed, syncMerged, syncFailed prometheus.Counter
	syncRefused                        refusedReasons
	clamped                            prometheus.Counter
	panics                             prometheus.Counter
	slowConsumer                       prometheus.Counter
	heartbeats                         prometheus.Counter
	antiEntropy                        prometheus.Counter
	duplicateNodeIDs                   prometheus.Counter
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
		peersRefused:     counter("peers_refused_total", "Messages from a new peer dropped because max_peers peers are known."),
		syncServed:       counter("sync_replies_sent_total", "Sync requests (warm starts, reconnects) answered."),
		syncMerged:       counter("sync_entries_merged_total", "Counts merged from sync replies."),
		syncFailed:       counter("sync_requests_failed_total", "Sync requests of this node that got no complete reply before their deadline."),
		clamped:          counter("entries_clamped_total", "Received counts above what a limit of their bucket on this node allows, lowered to that bound."),
		panics:           counter("callback_panics_total", "Panics recovered in a NATS message handler (a bug: the message is dropped, the node keeps running)."),
		slowConsumer:     counter("slow_consumer_events_total", "Messages the NATS client dropped because this node read too slowly (followed by a resync)."),
		heartbeats:       counter("heartbeats_sent_total", "Empty batches published because nothing changed for a heartbeat interval (peers see the node alive)."),
		antiEntropy:      counter("anti_entropy_entries_sent_total", "Unchanged live counts published again in the background (repairs a lost batch of a quiet key)."),
		duplicateNodeIDs: counter("duplicate_node_ids_total", "Times several live processes began to claim one node id (the same --node-id, or none on one host): logged once per episode; each still counts as a node of its own."),
	}
	syncRefused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "sync_requests_refused_total",
		Help: "Sync requests read but not answered, by reason.",
	}, []string{"reason"})
	bind(syncRefused, m.syncRefused.reasons())
	bind(dropped, m.dropped.reasons())
	bind(malformed, m.malformed.reasons())
	cs := []prometheus.Collector{
		m.batchesSent, m.earlyBatches, m.entriesSent, m.batchesReceived, m.entriesReceived, m.entriesMerged,
		dropped, malformed, m.batchesMissed, m.batchesRepeated, m.publishErrors, m.publishDuration,
		m.peersRefused, m.syncServed, m.syncMerged, m.syncFailed, syncRefused,
		m.clamped, m.panics, m.slowConsumer, m.heartbeats, m.antiEntropy, m.duplicateNodeIDs,
	}
	cs = append(cs, gauges(ns, sub)...)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("replicate: register metrics: %w", err)
		}
	}
	return m, nil
}
