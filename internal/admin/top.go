package admin

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// TopResponse is the body of GET /v1/top.
type TopResponse struct {
	Time    time.Time    `json:"time"`
	EpochMS int64        `json:"epoch_ms"`
	Buckets []BucketTops `json:"buckets"`
}

// BucketTops is one bucket and its tops (see top.Tops).
type BucketTops struct {
	Bucket    string `json:"bucket"`
	Protocol  string `json:"protocol"`
	Limit     int64  `json:"limit,omitempty"`
	WindowMS  int64  `json:"window_ms"`
	Algorithm string `json:"algorithm"`
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
	bucket string
	n      int
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
		case "n":
			n, err := strconv.Atoi(vals[0])
			if err != nil || n < 1 || n > maxKeys {
				return q, "n must be from 1 to " + strconv.Itoa(maxKeys)
			}
			q.n = n
		default:
			return q, "unknown parameter (bucket and n are known)"
		}
	}
	return q, ""
}

// tops reads the buckets q selects at now; ok false when a bucket was
// named and the configuration has none of that name.
func (s *Server) tops(q query, now time.Time) (TopResponse, bool) {
	resp := TopResponse{Time: now.UTC(), EpochMS: top.EpochMS, Buckets: []BucketTops{}}
	found := false
	for _, b := range s.deps.Buckets() {
		if q.bucket != "" && b.Name != q.bucket {
			continue
		}
		found = true
		t := s.deps.Sketch.Read(b.ID, now, q.n)
		for _, p := range []*top.Period{&t.Minute, t.Window} {
			if p == nil {
				continue
			}
			for _, l := range [][]top.Key{p.TopAdmitted, p.TopDenied} {
				for i := range l {
					l[i].Key = s.shownKey(l[i].Key)
				}
			}
		}
		resp.Buckets = append(resp.Buckets, BucketTops{
			Bucket: b.Name, Protocol: b.Protocol, Limit: b.Limit, WindowMS: b.WindowMS, Algorithm: b.Algorithm.String(), Tops: t,
		})
	}
	return resp, found || q.bucket == ""
}

func (s *Server) serveTop(w http.ResponseWriter, r *http.Request) {
	q, bad := parseQuery(r.URL.RawQuery)
	if bad != "" {
		http.Error(w, bad, http.StatusBadRequest)
		return
	}
	resp, ok := s.tops(q, time.Now())
	if !ok {
		http.Error(w, "no such bucket", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(resp); err != nil {
		s.log.Debug("admin: write /v1/top", "err", err)
	}
}
