package main

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// echoQuota answers every usage of every report with DENY_ALL for its id.
type echoQuota struct {
	usages atomic.Int64
	bad    atomic.Int64 // reports without the domain, or usages without the key entry
}

func (e *echoQuota) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if m.GetDomain() != rlqsDomain {
			e.bad.Add(1)
		}
		resp := &rlqsv3.RateLimitQuotaResponse{}
		for _, u := range m.GetBucketQuotaUsages() {
			e.usages.Add(1)
			if u.GetBucketId().GetBucket()[rlqsKeyEntry] == "" || u.GetBucketId().GetBucket()["name"] != rlqsBucket {
				e.bad.Add(1)
			}
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{
				BucketId: u.GetBucketId(),
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
					AssignmentTimeToLive: durationpb.New(time.Minute),
					RateLimitStrategy:    &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}},
				}},
			})
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

func TestRLQSLoad(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	e := &echoQuota{}
	rlqsv3.RegisterRateLimitQuotaServiceServer(srv, e)
	go srv.Serve(lis)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := rlqsLoad(ctx, rlqsConfig{target: lis.Addr().String(), streams: 3, buckets: 5, interval: 200 * time.Millisecond,
		duration: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// 15 initial reports of one usage each, then periodic ones (at 200,
	// 400 and 600 ms: at least one per stream on a slow machine) of 5.
	if res.Reports < 15+3 || res.Usages != 15+5*(res.Reports-15) {
		t.Errorf("reports %d usages %d, want 15 initial plus periodic ones of 5 usages", res.Reports, res.Usages)
	}
	if got := e.usages.Load(); got != res.Usages {
		t.Errorf("the server saw %d usages, the tool counted %d", got, res.Usages)
	}
	if n := e.bad.Load(); n != 0 {
		t.Errorf("%d reports or usages without the domain or the bucket id's entries", n)
	}
	if res.FirstAssign["n"] != 15 {
		t.Errorf("first assignments of %v bucket ids, want all 15", res.FirstAssign["n"])
	}
	// Answers to the last reports may come after the run ended.
	if n := res.Actions["DENY_ALL"]; n < 15 || n > res.Usages || len(res.Actions) != 1 {
		t.Errorf("actions %v for %d usages, want DENY_ALL for each answered one", res.Actions, res.Usages)
	}
	if res.Errors != 0 {
		t.Errorf("errors %d %v", res.Errors, res.ErrorKinds)
	}
}
