package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// TopResponse is the body of GET /v1/top.
type TopResponse struct {
	Time    time.Time    `json:"time"`
	EpochMS int64        `json:"epoch_ms"`
	Buckets []BucketTops `json:"buckets"`
	// With ?cluster=1: the nodes whose tops are merged in (this one
	// first), and the peers heard from lately that did not answer in
	// time (their hits are missing).
	Nodes   []string `json:"nodes,omitempty"`
	Missing []string `json:"missing,omitempty"`
}

// BucketTops is one bucket and its tops (see top.Tops).
type BucketTops struct {
	Bucket    string `json:"bucket"`
	Protocol  string `json:"protocol"`
	Limit     int64  `json:"limit,omitempty"`
	WindowMS  int64  `json:"window_ms"`
	Algorithm string `json:"algorithm"`
	// Unit and DeniedUnit say what the admitted and the denied hits
	// count (admin.Bucket).
	Unit       string `json:"unit"`
	DeniedUnit string `json:"denied_unit"`
	// InFlight, for a bucket of requests in flight, are the keys with the
	// most leases held now (hits: leases; the cluster's summed over the
	// nodes that answered).
	InFlight []top.Key `json:"in_flight,omitempty"`
	top.Tops
}

// Bounds of GET /v1/top's parameters.
const (
	defaultKeys    = 10
	maxKeys        = 100
	maxBucketBytes = 256
)

// query is a request's parameters: bucket (one bucket by name; empty:
// all) and n (keys per list).
type query struct {
	bucket  string
	n       int
	cluster bool
}

// parseQuery reads and checks the parameters; a message for a 400 when
// they are wrong.
func parseQuery(raw string) (query, string) {
	q := query{n: defaultKeys}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return q, "malformed query"
	}
	for name, vals := range v {
		if len(vals) != 1 {
			return q, "parameter " + strconv.Quote(name) + " given more than once"
		}
		switch name {
		case "bucket":
			if len(vals[0]) > maxBucketBytes {
				return q, "bucket name too long"
			}
			q.bucket = vals[0]
		case "cluster":
			if vals[0] != "1" && vals[0] != "0" {
				return q, "cluster must be 1 or 0"
			}
			q.cluster = vals[0] == "1"
		case "n":
			n, err := strconv.Atoi(vals[0])
			if err != nil || n < 1 || n > maxKeys {
				return q, "n must be from 1 to " + strconv.Itoa(maxKeys)
			}
			q.n = n
		default:
			return q, "unknown parameter (bucket, n and cluster are known)"
		}
	}
	return q, ""
}

// local reads this node's tops of the buckets q selects at now, with the
// keys as they are, and at most n keys per list; ok false when a bucket
// was named and the configuration has none of that name.
func (s *Server) local(q query, n int, now time.Time) (TopResponse, bool) {
	resp := TopResponse{Time: now.UTC(), EpochMS: top.EpochMS, Buckets: []BucketTops{}}
	found := false
	for _, b := range s.deps.Buckets() {
		if q.bucket != "" && b.Name != q.bucket {
			continue
		}
		found = true
		bt := BucketTops{
			Bucket: b.Name, Protocol: b.Protocol, Limit: b.Limit, WindowMS: b.WindowMS, Algorithm: b.Algorithm.String(),
			Unit: cmp.Or(b.Unit, "requests"), DeniedUnit: cmp.Or(b.DeniedUnit, b.Unit, "requests"),
			Tops: s.deps.Sketch.Read(b.ID, now, n),
		}
		if b.Unit == UnitInFlight && s.deps.InFlight != nil {
			held := map[string]uint64{}
			s.deps.InFlight(b.ID, func(key string, leases int64) { held[key] += uint64(leases) })
			bt.InFlight = topHeld(held, n)
		}
		resp.Buckets = append(resp.Buckets, bt)
	}
	return resp, found || q.bucket == ""
}

// tops is what GET /v1/top answers for q at now: this node's tops, or
// with q.cluster the cluster's, the keys as the listener shows them. ok
// false when a named bucket does not exist; bad is a reason for a 400.
func (s *Server) tops(ctx context.Context, q query, now time.Time) (resp TopResponse, ok bool, bad string) {
	if !q.cluster {
		resp, ok = s.local(q, q.n, now)
	} else if s.deps.Ask == nil {
		return resp, false, "this node is not in a cluster"
	} else if resp, ok = s.local(q, maxKeys, now); ok {
		s.gather(ctx, &resp, q)
	}
	for i := range resp.Buckets {
		for j := range resp.Buckets[i].InFlight {
			resp.Buckets[i].InFlight[j].Key = s.shownKey(resp.Buckets[i].InFlight[j].Key)
		}
		t := &resp.Buckets[i].Tops
		for _, p := range []*top.Period{&t.Minute, t.Window} {
			if p == nil {
				continue
			}
			for _, l := range []*[]top.Key{&p.TopAdmitted, &p.TopDenied} {
				*l = slices.DeleteFunc(*l, uncertain)
				for j := range *l {
					(*l)[j].Key = s.shownKey((*l)[j].Key)
				}
			}
		}
	}
	return resp, ok, ""
}

// uncertain reports whether a listed key's hits are more error than
// count: a key the sketch kept in a flood of distinct keys may have as
// little as one hit behind a large error, and says nothing about who
// spends the budget. Such entries are left out of every answer.
func uncertain(k top.Key) bool { return k.Error > 0 && k.Hits-min(k.Error, k.Hits) < k.Error }

// clusterTimeout bounds the wait for the peers' answers.
const clusterTimeout = 2 * time.Second

// topQuery is the body of a cluster query for tops; the answer is a
// TopResponse with the keys as they are.
type topQuery struct {
	Bucket string `json:"bucket,omitempty"`
}

// gather asks the peers for their tops of q's buckets and merges them
// into resp, this node's read with maxKeys keys per list; the merged
// lists keep q.n keys.
func (s *Server) gather(ctx context.Context, resp *TopResponse, q query) {
	self := "this node"
	if s.deps.Cluster != nil {
		self = s.deps.Cluster().Self
	}
	resp.Nodes = []string{self}
	body, _ := json.Marshal(topQuery{Bucket: q.bucket}) // cannot fail
	ctx, cancel := context.WithTimeout(ctx, clusterTimeout)
	defer cancel()
	answers, missing, err := s.deps.Ask(ctx, body)
	if err != nil {
		s.log.Debug("admin: ask the peers for their tops", "err", err)
	}
	resp.Missing = append([]string{}, missing...)
	parts := make([][]top.Tops, len(resp.Buckets))
	held := make([]map[string]uint64, len(resp.Buckets)) // a key's leases, summed over the nodes
	for i, b := range resp.Buckets {
		parts[i] = []top.Tops{b.Tops}
		held[i] = map[string]uint64{}
		for _, k := range b.InFlight {
			held[i][k.Key] += k.Hits
		}
	}
	for _, a := range answers {
		peer, err := decodeAnswer(a.Body)
		if err != nil {
			s.log.Debug("admin: a peer's tops do not decode", "peer", a.Peer, "err", err)
			resp.Missing = append(resp.Missing, a.Peer)
			continue
		}
		resp.Nodes = append(resp.Nodes, a.Peer)
		for _, pb := range peer.Buckets {
			for i, b := range resp.Buckets {
				if b.Bucket == pb.Bucket {
					parts[i] = append(parts[i], pb.Tops)
					for _, k := range pb.InFlight {
						held[i][k.Key] += k.Hits
					}
				}
			}
		}
	}
	for i := range resp.Buckets {
		resp.Buckets[i].Tops = top.Merge(parts[i], q.n)
		if resp.Buckets[i].InFlight != nil {
			resp.Buckets[i].InFlight = topHeld(held[i], q.n)
		}
	}
}

// topHeld is the n keys with the most leases, most first.
func topHeld(held map[string]uint64, n int) []top.Key {
	out := make([]top.Key, 0, len(held))
	for k, v := range held {
		out = append(out, top.Key{Key: k, Hits: v})
	}
	slices.SortFunc(out, func(a, b top.Key) int { return cmp.Or(cmp.Compare(b.Hits, a.Hits), cmp.Compare(a.Key, b.Key)) })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// maxAnswerBuckets bounds the buckets a peer's answer may hold.
const maxAnswerBuckets = 1 << 12

// decodeAnswer reads a peer's answer and checks its bounds: at most
// maxAnswerBuckets buckets, maxKeys keys per list, seven epochs.
func decodeAnswer(b []byte) (TopResponse, error) {
	var r TopResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode: %w", err)
	}
	if len(r.Buckets) > maxAnswerBuckets {
		return r, fmt.Errorf("%d buckets, at most %d", len(r.Buckets), maxAnswerBuckets)
	}
	for _, b := range r.Buckets {
		if len(b.Bucket) > maxBucketBytes {
			return r, fmt.Errorf("a bucket name of %d bytes, at most %d", len(b.Bucket), maxBucketBytes)
		}
		if len(b.Epochs) > top.Epochs {
			return r, fmt.Errorf("bucket %q: %d epochs", b.Bucket, len(b.Epochs))
		}
		if len(b.InFlight) > maxKeys {
			return r, fmt.Errorf("bucket %q: %d keys in flight, at most %d", b.Bucket, len(b.InFlight), maxKeys)
		}
		for _, p := range []*top.Period{&b.Minute, b.Window} {
			if p == nil {
				continue
			}
			if len(p.TopAdmitted) > maxKeys || len(p.TopDenied) > maxKeys {
				return r, fmt.Errorf("bucket %q: more than %d keys in a list", b.Bucket, maxKeys)
			}
			// A node keeps at most MaxMaxKeyBytes of a key: a longer one is
			// no node's answer.
			for _, k := range slices.Concat(p.TopAdmitted, p.TopDenied) {
				if len(k.Key) > top.MaxMaxKeyBytes {
					return r, fmt.Errorf("bucket %q: a key of %d bytes, at most %d", b.Bucket, len(k.Key), top.MaxMaxKeyBytes)
				}
			}
		}
	}
	return r, nil
}

// Answer answers a peer's cluster query for tops: this node's, with the
// keys as they are (the asker shows them as it shows its own), maxKeys
// per list; nil for a query it cannot read. Install it with the
// replicator's SetAnswerer.
func (s *Server) Answer(body []byte) []byte {
	var q topQuery
	if err := json.Unmarshal(body, &q); err != nil || len(q.Bucket) > maxBucketBytes {
		return nil
	}
	resp, _ := s.local(query{bucket: q.Bucket}, maxKeys, time.Now())
	b, _ := json.Marshal(resp) // cannot fail
	return b
}

// read answers r's query with the tops it asks for, or writes the error
// (400, 404) and reports false.
func (s *Server) read(w http.ResponseWriter, r *http.Request) (TopResponse, bool) {
	q, bad := parseQuery(r.URL.RawQuery)
	if bad != "" {
		http.Error(w, bad, http.StatusBadRequest)
		return TopResponse{}, false
	}
	resp, ok, bad := s.tops(r.Context(), q, time.Now())
	if bad != "" {
		http.Error(w, bad, http.StatusBadRequest)
		return resp, false
	}
	if !ok {
		http.Error(w, "no such bucket", http.StatusNotFound)
	}
	return resp, ok
}

func (s *Server) serveTop(w http.ResponseWriter, r *http.Request) {
	resp, ok := s.read(w, r)
	if !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(resp); err != nil {
		s.log.Debug("admin: write /v1/top", "err", err)
	}
}
