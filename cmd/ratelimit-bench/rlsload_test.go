package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

func TestOverallCodeReadsTheDecision(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp *rlsv3.RateLimitResponse
		want rlsv3.RateLimitResponse_Code
	}{
		{"empty", &rlsv3.RateLimitResponse{}, rlsv3.RateLimitResponse_UNKNOWN},
		{"ok with statuses", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 3, DurationUntilReset: durationpb.New(1e9)}}}, rlsv3.RateLimitResponse_OK},
		{"over", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: []byte("x")}, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		b, err := proto.Marshal(tc.resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := codeField(b)
		if err != nil || rlsv3.RateLimitResponse_Code(got) != tc.want {
			t.Errorf("%s: overall_code = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := codeField([]byte{0x08}); err == nil {
		t.Error("truncated varint: no error")
	}
}

// FuzzOverallCode: the tool reads what the protobuf library reads from
// any answer it accepts, and never panics on one it does not.
func FuzzOverallCode(f *testing.F) {
	for _, r := range []*rlsv3.RateLimitResponse{
		{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT},
		{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 2, LimitRemaining: 9}}},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{0x0a, 0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := codeField(b)
		var m rlsv3.RateLimitResponse
		if perr := proto.Unmarshal(b, &m); perr == nil && err == nil && rlsv3.RateLimitResponse_Code(got) != m.GetOverallCode() {
			t.Fatalf("overall_code %v, proto reads %v", got, m.GetOverallCode())
		}
	})
}

func TestRLSRequestDescriptors(t *testing.T) {
	r := request{route: "activities", path: "/api/activities", clientIP: "10.0.0.7", headers: map[string]string{"x-tenant-id": "tenant-3"}}
	one := rlsRequest(r, 1)
	if one.Domain != rlsBenchDomain || len(one.Descriptors) != 1 || one.Descriptors[0].Entries[0].Key != "remote_address" || one.Descriptors[0].Entries[0].Value != "10.0.0.7" {
		t.Errorf("one descriptor: %v", one)
	}
	three := rlsRequest(r, 3)
	if len(three.Descriptors) != 3 {
		t.Fatalf("three: %v", three)
	}
	if e := three.Descriptors[1].Entries; len(e) != 2 || e[0].Value != "activities" || e[1].Key != "tenant" || e[1].Value != "tenant-3" {
		t.Errorf("second descriptor %v", e)
	}
	if e := three.Descriptors[2].Entries; e[0].Key != "path" || e[0].Value != "/api/activities" {
		t.Errorf("third descriptor %v", e)
	}
	anon := rlsRequest(request{route: "legacy_tokens", path: "/api/v1/tokens", clientIP: "10.0.0.1", headers: map[string]string{}}, 2)
	if v := anon.Descriptors[1].Entries[1].Value; v != "-" {
		t.Errorf("tenant of a request without one: %q, want -", v)
	}
	if p := rlsRequest(request{route: "unmatched"}, 1); p.Domain != rlsProbeDomain {
		t.Errorf("probe domain %q", p.Domain)
	}
}

// The benchmark's descriptor file is YAML of the format's shape: three
// rules, each with the limit given.
func TestRLSBenchConfig(t *testing.T) {
	type rule struct {
		Unit            string
		RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	}
	var doc struct {
		Domain      string
		Descriptors []struct {
			Key         string
			RateLimit   *rule `yaml:"rate_limit"`
			Descriptors []struct {
				Key       string
				RateLimit *rule `yaml:"rate_limit"`
			}
		}
	}
	if err := yaml.Unmarshal([]byte(rlsBenchConfig(7, "minute")), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Domain != rlsBenchDomain || len(doc.Descriptors) != 3 {
		t.Fatalf("%+v", doc)
	}
	rl := doc.Descriptors[1].Descriptors[0].RateLimit
	if doc.Descriptors[0].Key != "remote_address" || doc.Descriptors[0].RateLimit.RequestsPerUnit != 7 ||
		doc.Descriptors[1].Key != "generic_key" || rl == nil || rl.Unit != "minute" || doc.Descriptors[2].Key != "path" {
		t.Errorf("%+v", doc)
	}
}

// fakeRLS answers OVER_LIMIT for one client address, OK otherwise, and
// records the domains and descriptor counts it saw.
type fakeRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu      sync.Mutex
	domains map[string]int
	descs   map[int]int
}

func (f *fakeRLS) ShouldRateLimit(_ context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	f.mu.Lock()
	f.domains[r.GetDomain()]++
	f.descs[len(r.GetDescriptors())]++
	f.mu.Unlock()
	code := rlsv3.RateLimitResponse_OK
	if d := r.GetDescriptors(); len(d) > 0 && d[0].GetEntries()[0].GetValue() == ipKey(0) {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

func TestRLSAgainstAFakeService(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	f := &fakeRLS{domains: map[string]int{}, descs: map[int]int{}}
	rlsv3.RegisterRateLimitServiceServer(g, f)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	// Two client addresses, uniform: about half the calls are over.
	res, out, err := runCLI(t, "rls", "--target", lis.Addr().String(), "--descriptors", "3", "--ips", "2", "--keys", "uniform",
		"--requests", "400", "--warmup", "0", "--duration", "20s", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Mode != "rls" || res.Requests != 400 || res.Errors != 0 || res.Allowed+res.Denied != 400 || res.Denied < 100 || res.Denied > 300 {
		t.Errorf("result %+v", res)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.domains[rlsProbeDomain] != 1 || f.domains[rlsBenchDomain] != 400 || f.descs[3] != 401 {
		t.Errorf("the service saw domains %v and descriptor counts %v; want one probe and 400 calls of 3", f.domains, f.descs)
	}
	if _, _, err := runCLI(t, "rls", "--target", lis.Addr().String(), "--descriptors", "4"); err == nil {
		t.Error("--descriptors 4 accepted")
	}
}

func TestRLSConfigCommand(t *testing.T) {
	_, out, err := runCLI(t, "rls-config", "--limit", "7", "--unit", "minute")
	if err != nil || out != rlsBenchConfig(7, "minute") {
		t.Errorf("rls-config: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"--unit", "fortnight"}, {"--limit", "4294967296"}, {"extra"}} {
		if _, _, err := runCLI(t, append([]string{"rls-config"}, args...)...); err == nil {
			t.Errorf("rls-config %v accepted", args)
		}
	}
}

// The no-op server answers ShouldRateLimit too, on the product's stack.
func TestRLSAgainstTheNoopServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := freeport.TestAddrs(t, 2)
	done := make(chan error, 1)
	go func() {
		done <- serveNoop(ctx, serveConfig{grpcAddr: addrs[0], httpAddr: addrs[1], lifetime: time.Minute}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("noop: %v", err)
		}
	})
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		resp, err := http.Get("http://" + addrs[1] + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
	res, out, err := runCLI(t, "rls", "--target", addrs[0], "--descriptors", "3", "--requests", "300", "--warmup", "0", "--duration", "20s", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Requests != 300 || res.Allowed != 300 || res.Errors != 0 {
		t.Errorf("result %+v", res)
	}
}

// The request carries one RateLimitReq per descriptor, with the rls
// load's keys and the limit given, in gubernator's field numbers.
func TestGuberRequestEncodesTheRLSKeys(t *testing.T) {
	b := guberRequest(request{route: "activities", path: "/v1/x", clientIP: "10.0.0.1", headers: map[string]string{"x-tenant-id": "t1"}}, 3, 7, 2*time.Second)
	type req struct {
		name, key             string
		hits, limit, duration uint64
	}
	var got []req
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			t.Fatalf("field %d type %d (n %d): want requests (1, bytes)", num, typ, n)
		}
		b = b[n:]
		m, n := protowire.ConsumeBytes(b)
		if n < 0 {
			t.Fatal("truncated RateLimitReq")
		}
		b = b[n:]
		var r req
		for len(m) > 0 {
			num, typ, n := protowire.ConsumeTag(m)
			m = m[n:]
			switch {
			case typ == protowire.BytesType:
				v, n := protowire.ConsumeBytes(m)
				m = m[n:]
				if num == 1 {
					r.name = string(v)
				} else if num == 2 {
					r.key = string(v)
				}
			case typ == protowire.VarintType:
				v, n := protowire.ConsumeVarint(m)
				m = m[n:]
				switch num {
				case 3:
					r.hits = v
				case 4:
					r.limit = v
				case 5:
					r.duration = v
				}
			default:
				t.Fatalf("field %d: unexpected type %d", num, typ)
			}
		}
		got = append(got, r)
	}
	want := []req{
		{"bench_remote_address", "10.0.0.1", 1, 7, 2000},
		{"bench_generic_key", "activities_t1", 1, 7, 2000},
		{"bench_path", "/v1/x", 1, 7, 2000},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d requests, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestGuberStatus(t *testing.T) {
	resp := func(status uint64, errMsg string) []byte {
		var m []byte
		if status != 0 {
			m = protowire.AppendTag(m, 1, protowire.VarintType)
			m = protowire.AppendVarint(m, status)
		}
		m = protowire.AppendTag(m, 2, protowire.VarintType)
		m = protowire.AppendVarint(m, 5)
		if errMsg != "" {
			m = protowire.AppendTag(m, 5, protowire.BytesType)
			m = protowire.AppendString(m, errMsg)
		}
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		return protowire.AppendBytes(b, m)
	}
	cat := func(bs ...[]byte) (out []byte) {
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	for _, c := range []struct {
		name    string
		in      []byte
		want    int32
		wantErr bool
	}{
		{"empty", nil, 0, false},
		{"under", resp(0, ""), 0, false},
		{"over", resp(1, ""), 1, false},
		{"one of three over", cat(resp(0, ""), resp(1, ""), resp(0, "")), 1, false},
		{"error", resp(0, "no peer"), 0, true},
		{"truncated", resp(1, "")[:3], 0, true},
	} {
		got, err := guberStatus(c.in)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s: %d, %v; want %d, error %v", c.name, got, err, c.want, c.wantErr)
		}
	}
}

// FuzzGuberStatus: any answer is read as under (0), over (1) or an error,
// never a panic.
func FuzzGuberStatus(f *testing.F) {
	var over []byte
	over = protowire.AppendTag(over, 1, protowire.VarintType)
	over = protowire.AppendVarint(over, 1)
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, over)
	f.Add(b)
	f.Add([]byte{0x0a, 0x02, 0x2a, 0x00})
	f.Add([]byte{0x0a, 0x80})
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := guberStatus(in)
		if err == nil && got != 0 && got != 1 {
			t.Fatalf("status %d", got)
		}
	})
}
