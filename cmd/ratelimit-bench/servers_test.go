package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// noop-grpc answers every Check OK, serves readiness and profiles on
// their own addresses, registers nothing but the Authorization service,
// and ends when its context does.
func TestNoopGRPCServesTheFloor(t *testing.T) {
	addrs, err := freeport.Addrs(3)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"noop-grpc", "--grpc-addr", addrs[0], "--http-addr", addrs[1], "--pprof-addr", addrs[2], "--lifetime", "60s"}, io.Discard, io.Discard)
	}()
	get := func(url string) int {
		resp, err := http.Get(url)
		if err != nil {
			return -1
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	poll.UntilTrue(t, 20*time.Second, 20*time.Millisecond, func() bool { return get("http://"+addrs[1]+"/readyz") == 200 })

	res, out, err := runCLI(t, "check", "--target", addrs[0], "--concurrency", "4", "--connections", "2",
		"--requests", "300", "--warmup", "0", "--duration", "20s", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Requests != 300 || res.Allowed != 300 || res.Denied != 0 || res.Errors != 0 {
		t.Errorf("result %+v", res)
	}

	for path, want := range map[string]int{"/debug/pprof/": 200, "/debug/pprof/profile?seconds=1": 200, "/debug/pprof/cmdline": 404} {
		if got := get("http://" + addrs[2] + path); got != want {
			t.Errorf("pprof %s: %d, want %d", path, got, want)
		}
	}
	if got := get("http://" + addrs[1] + "/debug/pprof/"); got == 200 {
		t.Error("profiles on the HTTP address too")
	}

	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "d"})
	ccancel()
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit on the default no-op: %v, %v; want OK", resp, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("noop-grpc: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("noop-grpc did not stop within 15s of its context ending")
	}
}

// A port already in use is a clear error, not a hang.
func TestNoopGRPCAddressInUse(t *testing.T) {
	busy := freeport.TestAddr(t)
	l, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", busy)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	httpAddr := freeport.TestAddr(t)
	_, out, err := runCLI(t, "noop-grpc", "--grpc-addr", busy, "--http-addr", httpAddr, "--lifetime", "10s")
	if err == nil || !strings.Contains(err.Error()+out, "listen on "+busy) {
		t.Errorf("busy gRPC address: %v\n%s", err, out)
	}
	_, out, err = runCLI(t, "noop-grpc", "--grpc-addr", httpAddr, "--http-addr", busy, "--lifetime", "10s")
	if err == nil || !strings.Contains(err.Error()+out, "listen on "+busy) {
		t.Errorf("busy HTTP address: %v\n%s", err, out)
	}
}
