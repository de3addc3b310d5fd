package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

const inflightRules = `
buckets:
  db_pool: {count: concurrency, limit: 1, key: tenant}
routes:
  - {path: /reports, buckets: [db_pool]}
`

// TestNodeConcurrencyBucket: a node's Check takes the leases of its
// concurrency buckets and its access-log service releases them; the
// in-flight gauge names the bucket, also one a reload adds.
func TestNodeConcurrencyBucket(t *testing.T) {
	n := start(t, local(parseRules(t, inflightRules)))
	c, conn := dial(t, n.GRPCAddr())
	check := func(id string) *authv3.CheckResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.Check(ctx, request("GET", "/reports", map[string]string{"x-tenant-id": "acme", "x-request-id": id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	held := check("r1")
	if held.GetStatus().GetCode() != int32(codes.OK) || check("r2").GetStatus().GetCode() == int32(codes.OK) {
		t.Fatal("want the first admitted and the second denied")
	}
	if v := gathered(t, n, `ratelimit_authz_inflight_requests{bucket="db_pool"}`); v != 1 {
		t.Fatalf("in flight %v, want 1", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	entry := &accesslogv3.HTTPAccessLogEntry{
		CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{
			FilterMetadata: map[string]*structpb.Struct{accesslog.MetadataNamespace: held.GetDynamicMetadata()},
		}},
		Request:  &accesslogv3.HTTPRequestProperties{RequestId: "r1"},
		Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(200)},
	}
	if err := stream.Send(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogv3.HTTPAccessLogEntry{entry}},
	}}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if v := gathered(t, n, `ratelimit_authz_inflight_requests{bucket="db_pool"}`); v != 0 {
			return fmt.Errorf("in flight %v after the release", v)
		}
		return nil
	})
	if check("r3").GetStatus().GetCode() != int32(codes.OK) {
		t.Fatal("the released slot was not given")
	}

	r := parseRules(t, `
buckets:
  db_pool: {count: concurrency, limit: 1, key: tenant}
  jobs: {count: concurrency, limit: 2, key: tenant}
routes:
  - {path: /reports, buckets: [db_pool]}
  - {path: /jobs, buckets: [jobs]}
`)
	if err := n.Reload(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if v := gathered(t, n, `ratelimit_authz_inflight_requests{bucket="jobs"}`); v != 0 {
		t.Fatalf("jobs in flight %v, want 0", v)
	}
}
