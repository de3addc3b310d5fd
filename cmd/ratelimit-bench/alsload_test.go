package main

import (
	"net"
	"strconv"
	"sync"
	"testing"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// The access-log load against a real node on the worked example of
// docs/cost-budgets.md: every entry sent is charged, at the cost it
// reports, to the bucket it names, and the run ends only once the node
// has taken them all.
func TestAccessLogChargesARealNode(t *testing.T) {
	r, err := configfile.LoadFile("../../config/examples/llm-budget.yaml")
	n := startNode(t, r, err)
	res, out, err := runCLI(t, "accesslog", "--target", n.GRPCAddr().String(), "--bucket", "llm_tokens", "--cost", "7",
		"--tenants", "3", "--keys", "uniform", "--concurrency", "8", "--connections", "2",
		"--requests", "300", "--warmup", "0", "--duration", "20s", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Mode != "accesslog" || res.Requests != 300 || res.Allowed != 300 || res.Errors != 0 {
		t.Errorf("result %+v", res)
	}
	g := n.Gatherer()
	if got := scrape.Read(t, g, "ratelimit_authz_cost_charged_total", "bucket", "llm_tokens"); got != 300*7 {
		t.Errorf("the node charged %v tokens, want 300 entries × 7", got)
	}
	if got := scrape.Read(t, g, "ratelimit_authz_failures_accesslog_entries_total", "result", "counted"); got != 300 {
		t.Errorf("the node counted %v entries, want 300", got)
	}
	if got := scrape.Read(t, g, "ratelimit_authz_failures_accesslog_entries_total", "result", "ignored"); got != 1 {
		t.Errorf("the node ignored %v entries, want the probe's alone", got)
	}
	// A route without a tenant has nothing to charge: refused up front.
	if _, _, err := runCLI(t, "accesslog", "--target", n.GRPCAddr().String(), "--routes", "inbound", "--requests", "5"); err == nil {
		t.Error("a tenant-less route accepted")
	}
}

// fakeALS records each entry's charged key and reported cost; it answers
// a stream only once the client half-closes it.
type fakeALS struct {
	mu      sync.Mutex
	charges map[string]int64 // tenant → sum of reported costs
	entries int
}

func (f *fakeALS) StreamAccessLogs(st grpc.ClientStreamingServer[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]) error {
	for {
		m, err := st.Recv()
		if err != nil {
			return st.SendAndClose(&alsv3.StreamAccessLogsResponse{})
		}
		for _, e := range m.GetHttpLogs().GetLogEntry() {
			md := e.GetCommonProperties().GetMetadata().GetFilterMetadata()[extAuthzNamespace]
			key := md.GetFields()[chargesField].GetStructValue().GetFields()["b"].GetStringValue()
			cost, _ := strconv.ParseInt(e.GetResponse().GetResponseHeaders()["x-cost"], 10, 64)
			f.mu.Lock()
			f.entries++
			if key != "" {
				f.charges[key] += cost
			}
			f.mu.Unlock()
		}
	}
}

// Each entry names the bucket and the request's tenant, and reports the
// cost in the header asked for: one tenant, 250 entries of 3.
func TestAccessLogEntriesCarryTheCharge(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	f := &fakeALS{charges: map[string]int64{}}
	alsv3.RegisterAccessLogServiceServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	res, out, err := runCLI(t, "accesslog", "--target", lis.Addr().String(), "--bucket", "b", "--cost-header", "x-cost", "--cost", "3",
		"--tenants", "1", "--keys", "uniform", "--requests", "250", "--warmup", "0", "--duration", "20s", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if res.Allowed != 250 || f.entries != 251 || len(f.charges) != 1 || f.charges["tenant-0"] != 750 {
		t.Errorf("sent %d, the service saw %d entries charging %v; want 250 and the probe, 750 to tenant-0", res.Allowed, f.entries, f.charges)
	}
}
