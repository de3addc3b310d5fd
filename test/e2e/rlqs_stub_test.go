package e2e

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// quotaStub is a minimal RateLimitQuotaService: it records what Envoy's
// quota filter sends and when, and answers each report with what answer
// returns for its buckets. It is the instrument the tests of Envoy's own
// behaviour read; the product's server is tested against the same Envoy
// elsewhere.
type quotaStub struct {
	addr string
	srv  *grpc.Server

	mu      sync.Mutex
	answer  func(id map[string]string, first bool) *rlqsv3.RateLimitQuotaResponse_BucketAction
	streams []*stubStream // every stream Envoy opened, in order
	seen    map[string]bool
	wake    chan struct{} // closed and replaced at every event
}

// stubStream is one StreamRateLimitQuotas call.
type stubStream struct {
	opened, closed time.Time
	reports        []stubReport
	send           chan *rlqsv3.RateLimitQuotaResponse
	end            chan error // a value ends the call with it
}

// stubReport is one RateLimitQuotaUsageReports message, as received.
type stubReport struct {
	at     time.Time
	domain string
	usages []stubUsage
}

type stubUsage struct {
	id               map[string]string
	allowed, denied  uint64
	elapsed          time.Duration
	hasElapsedRecord bool
}

func startQuotaStub(t *testing.T, addr string) *quotaStub {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("stub RLQS: %v", err)
	}
	q := &quotaStub{addr: lis.Addr().String(), srv: grpc.NewServer(), seen: map[string]bool{}, wake: make(chan struct{})}
	rlqsv3.RegisterRateLimitQuotaServiceServer(q.srv, q)
	go q.srv.Serve(lis)
	t.Cleanup(q.srv.Stop)
	return q
}

func idKey(id map[string]string) string {
	keys := slices.Sorted(maps.Keys(id))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s;", k, id[k])
	}
	return b.String()
}

func (q *quotaStub) event() {
	close(q.wake)
	q.wake = make(chan struct{})
}

// StreamRateLimitQuotas records the stream and its reports and answers
// each report's buckets with q.answer.
func (q *quotaStub) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	s := &stubStream{opened: time.Now(), send: make(chan *rlqsv3.RateLimitQuotaResponse, 16), end: make(chan error, 1)}
	q.mu.Lock()
	q.streams = append(q.streams, s)
	q.event()
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		s.closed = time.Now()
		q.event()
		q.mu.Unlock()
	}()
	recv := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case recv <- m:
			case <-st.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case err := <-s.end:
			return err
		case err := <-recvErr:
			return err
		case m := <-s.send:
			if err := st.Send(m); err != nil {
				return err
			}
		case m := <-recv:
			r := stubReport{at: time.Now(), domain: m.GetDomain()}
			resp := &rlqsv3.RateLimitQuotaResponse{}
			q.mu.Lock()
			for _, u := range m.GetBucketQuotaUsages() {
				id := maps.Clone(u.GetBucketId().GetBucket())
				r.usages = append(r.usages, stubUsage{id: id, allowed: u.GetNumRequestsAllowed(), denied: u.GetNumRequestsDenied(),
					elapsed: u.GetTimeElapsed().AsDuration(), hasElapsedRecord: u.GetTimeElapsed() != nil})
				k := idKey(id)
				first := !q.seen[k]
				q.seen[k] = true
				if q.answer != nil {
					if a := q.answer(id, first); a != nil {
						resp.BucketAction = append(resp.BucketAction, a)
					}
				}
			}
			s.reports = append(s.reports, r)
			q.event()
			q.mu.Unlock()
			if len(resp.BucketAction) > 0 {
				if err := st.Send(resp); err != nil {
					return err
				}
			}
		}
	}
}

// setAnswer sets how the stub answers reports from now on.
func (q *quotaStub) setAnswer(f func(id map[string]string, first bool) *rlqsv3.RateLimitQuotaResponse_BucketAction) {
	q.mu.Lock()
	q.answer = f
	q.mu.Unlock()
}

// push sends resp on the newest open stream.
func (q *quotaStub) push(t *testing.T, resp *rlqsv3.RateLimitQuotaResponse) {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := len(q.streams) - 1; i >= 0; i-- {
		if q.streams[i].closed.IsZero() {
			q.streams[i].send <- resp
			return
		}
	}
	t.Fatal("stub RLQS: no open stream to push to")
}

// endStreams ends every open stream with err.
func (q *quotaStub) endStreams(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range q.streams {
		if s.closed.IsZero() {
			select {
			case s.end <- err:
			default:
			}
		}
	}
}

// snapshot copies what the stub has seen.
func (q *quotaStub) snapshot() []stubStream {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]stubStream, len(q.streams))
	for i, s := range q.streams {
		out[i] = stubStream{opened: s.opened, closed: s.closed, reports: slices.Clone(s.reports)}
	}
	return out
}

// reportsOf are the usages of bucket id (every key given must match),
// with the time of their report, across all streams.
func (q *quotaStub) reportsOf(id map[string]string) []timedUsage {
	var out []timedUsage
	for _, s := range q.snapshot() {
		for _, r := range s.reports {
			for _, u := range r.usages {
				if matchesID(u.id, id) {
					out = append(out, timedUsage{at: r.at, stubUsage: u})
				}
			}
		}
	}
	return out
}

type timedUsage struct {
	at time.Time
	stubUsage
}

func matchesID(got, want map[string]string) bool {
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// waitFor waits up to d for cond, re-checking at every stub event; it
// reports whether cond held.
func (q *quotaStub) waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.After(d)
	for {
		q.mu.Lock()
		w := q.wake
		q.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-w:
		case <-deadline:
			return cond()
		}
	}
}

var errStubEnd = errors.New("stub RLQS: stream ended by the test")

// assign is a quota assignment for id with strategy s and ttl.
func assign(id map[string]string, ttl time.Duration, s *typev3.RateLimitStrategy) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s}},
	}
}

func abandon(id map[string]string) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{
			AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

func perSecond(n uint64) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: n, TimeUnit: typev3.RateLimitUnit_SECOND}}}
}

func tokenBucket(maxTokens, perFill uint32, fill time.Duration) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: maxTokens, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(fill)}}}
}
