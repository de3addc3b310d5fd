package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
	"github.com/ratelimit-authz/ratelimit-authz/internal/node"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

func TestStatusCodeReadsTheDecision(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp *authv3.CheckResponse
		want int32
	}{
		{"no status", &authv3.CheckResponse{}, 0},
		{"ok with headers", &authv3.CheckResponse{
			Status: &rpcstatus.Status{},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
				ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "ratelimit", Value: `"a";r=1;t=1`}}},
			}},
		}, 0},
		{"denied", &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: 8, Message: "rate limited"},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status: &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests}, Body: `{"error":"rate_limited"}`,
			}},
		}, 8},
		{"missing key", &authv3.CheckResponse{Status: &rpcstatus.Status{Code: 7}}, 7},
	} {
		b, err := proto.Marshal(tc.resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := statusCode(b)
		if err != nil || got != tc.want {
			t.Errorf("%s: statusCode = %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
	if _, err := statusCode([]byte{0x0a, 0x05, 0x08}); err == nil {
		t.Error("truncated message: no error")
	}
	// A status in two parts, the second without a code: protobuf merges
	// them, and the first part's code stands.
	if got, err := statusCode([]byte{0x0a, 0x02, 0x08, 0x08, 0x0a, 0x02, 0x12, 0x00}); err != nil || got != 8 {
		t.Errorf("status in two parts: %d, %v; want 8", got, err)
	}
}

// FuzzStatusCode: the tool reads the code the protobuf library reads from
// any answer it accepts, and never panics on one it does not.
func FuzzStatusCode(f *testing.F) {
	for _, r := range []*authv3.CheckResponse{{}, {Status: &rpcstatus.Status{Code: 8, Message: "rate limited"}}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0x08, 0x08, 0x0a, 0x02, 0x12, 0x00})
	f.Add([]byte{0x0a, 0x05, 0x08})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := statusCode(b)
		var m authv3.CheckResponse
		if perr := proto.Unmarshal(b, &m); perr == nil && err == nil && got != m.GetStatus().GetCode() {
			t.Fatalf("status.code %d, proto reads %d", got, m.GetStatus().GetCode())
		}
	})
}

func TestCheckRequestIsWhatEnvoySends(t *testing.T) {
	m, _ := parseMix("admin_login")
	g := newGenerator(m, keySpec{dist: keysUniform, tenants: 1, channels: 1, ips: 1, accounts: 1}, 1, 0, nil)
	login := g.next()
	cr := checkRequest(login, 42, time.Unix(1, 0))
	h := cr.GetAttributes().GetRequest().GetHttp()
	if h.GetBody() == "" || !strings.Contains(h.GetBody(), `"email":"user0@example.com"`) {
		t.Errorf("login body %q", h.GetBody())
	}
	if h.GetHeaders()["x-envoy-external-address"] != "10.0.0.0" || h.GetHeaders()[":path"] != "/admin/login" {
		t.Errorf("headers %v", h.GetHeaders())
	}
	if got := cr.GetAttributes().GetSource().GetAddress().GetSocketAddress().GetAddress(); got != "10.0.0.0" {
		t.Errorf("peer %q", got)
	}
	m, _ = parseMix("converger_uploads")
	g.mix = m
	up := checkRequest(g.next(), 43, time.Unix(1, 0))
	if b := up.GetAttributes().GetRequest().GetHttp().GetBody(); b != "" {
		t.Errorf("non-login route carries a body %q (Envoy does not buffer it)", b)
	}
	if id := requestID(42); len(id) != 36 || id != requestID(42) || id == requestID(43) {
		t.Errorf("requestID: %q", id)
	}
}

// startServer serves svc behind internal/server on loopback ports and returns
// its gRPC address.
func startServer(t *testing.T, svc authv3.AuthorizationServer) string {
	t.Helper()
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, server.Services{Authz: svc}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return srv.GRPCAddr().String()
}

func runCLI(t *testing.T, args ...string) (loadresult.Result, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, args, &stdout, &stderr)
	var res loadresult.Result
	if err == nil && strings.Contains(strings.Join(args, " "), "--json -") {
		if jerr := json.Unmarshal(stdout.Bytes(), &res); jerr != nil {
			t.Fatalf("JSON output: %v\n%s", jerr, stdout.String())
		}
	}
	return res, stdout.String() + stderr.String(), err
}

func TestCheckAgainstTheNoopServer(t *testing.T) {
	authz, _ := noops()
	addr := startServer(t, authz)
	res, out, err := runCLI(t, "check", "--target", addr, "--concurrency", "4", "--connections", "2",
		"--requests", "400", "--warmup", "0", "--duration", "20s", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Requests != 400 || res.Allowed != 400 || res.Errors != 0 || res.Mode != "check" || res.Connections != 2 {
		t.Errorf("result %+v", res)
	}
}

// startNode runs a node of the server on r until the test ends.
func startNode(t *testing.T, r *configfile.Rules, err error) *node.Node {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n, err := node.New(ctx, node.Config{Rules: r, Version: "bench", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ShutdownTimeout: time.Second, SweepInterval: time.Second}, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	})
	return n
}

func TestCheckAgainstTheRealService(t *testing.T) {
	r, err := configfile.Parse(config.Default(), config.Name)
	addr := startNode(t, r, err).GRPCAddr().String()
	// One tenant, 300 activity writes: the shipped 100/s denies most of
	// them (fewer if the run spans several second windows, each of which
	// admits at most the limit). The deadline is generous so that a slow
	// machine delays answers rather than losing them.
	res, out, err := runCLI(t, "check", "--target", addr, "--routes", "activities", "--tenants", "1",
		"--keys", "uniform", "--requests", "300", "--warmup", "0", "--duration", "20s", "--timeout", "10s", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Errors != 0 || res.Allowed < 100 || res.Denied != 300-res.Allowed || res.Codes["8"] != res.Denied {
		t.Errorf("allowed %d denied %d errors %d codes %v; want at least 100 allowed, the rest RESOURCE_EXHAUSTED", res.Allowed, res.Denied, res.Errors, res.Codes)
	}
	// The run lasted at most ElapsedS (plus the part of a window before
	// it): each window it touched admitted at most the limit.
	if windows := int64(res.ElapsedS) + 2; res.Allowed > 100*windows {
		t.Errorf("allowed %d in %.1fs: more than 100 a second", res.Allowed, res.ElapsedS)
	}
}

func TestHTTPClassifiesStatuses(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch {
		case strings.HasPrefix(r.URL.Path, "/api/inbound/"):
			w.WriteHeader(http.StatusTooManyRequests)
		case r.URL.Path == "/api/v1/tokens":
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer up.Close()
	res, out, err := runCLI(t, "http", "--target", up.Listener.Addr().String(), "--routes", "activities,inbound,legacy_tokens",
		"--concurrency", "3", "--requests", "300", "--warmup", "0", "--json", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Requests != 300 || res.Codes["200"] != res.Allowed || res.Codes["429"] != res.Denied || res.Codes["503"] != res.Errors {
		t.Errorf("result %+v", res)
	}
	if res.Allowed == 0 || res.Denied == 0 || res.Errors == 0 || res.ErrorKinds["HTTP 503 Service Unavailable"] != res.Errors {
		t.Errorf("allowed %d denied %d errors %d (%v): want some of each", res.Allowed, res.Denied, res.Errors, res.ErrorKinds)
	}
}

func TestUpstreamAnswersOK(t *testing.T) {
	srv := httptest.NewServer(upstreamHandler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/api/activities", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"ok":true`) {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
}

func TestCLIErrors(t *testing.T) {
	// A port nobody listens on.
	dead := freeport.TestAddr(t)
	for _, tc := range []struct {
		args  []string
		usage bool
		want  string
	}{
		{[]string{}, true, "Usage:"},
		{[]string{"frobnicate"}, true, `unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, true, `unknown command "frobnicate"`},
		{[]string{"check", "--routes", "nope"}, true, `unknown route "nope"`},
		{[]string{"check", "--keys", "pareto"}, true, "use uniform, zipf or unique"},
		{[]string{"check", "--concurrency", "0"}, true, "--concurrency 0"},
		{[]string{"check", "--connections", "0"}, true, "--connections 0"},
		{[]string{"check", "--bogus"}, true, "flag provided but not defined"},
		{[]string{"check", "extra"}, true, `unexpected argument "extra"`},
		{[]string{"noop", "--lifetime", "0s"}, true, "--lifetime"},
		{[]string{"noop-grpc", "--lifetime", "0s"}, true, "--lifetime"},
		{[]string{"check", "--target", dead, "--duration", "1s"}, false, "does not answer"},
		{[]string{"http", "--target", dead, "--duration", "1s"}, false, "does not answer"},
		{[]string{"accesslog", "--target", dead, "--duration", "1s"}, false, "does not answer"},
		{[]string{"accesslog", "--cost", "-1"}, true, "--cost"},
	} {
		_, out, err := runCLI(t, tc.args...)
		var ue cli.UsageError
		if err == nil || errors.As(err, &ue) != tc.usage {
			t.Errorf("%v: error %v (usage error: %v)", tc.args, err, errors.As(err, &ue))
			continue
		}
		if msg := err.Error() + out; !strings.Contains(msg, tc.want) {
			t.Errorf("%v: %q does not say %q", tc.args, msg, tc.want)
		}
	}
}

// The routes listing names each route's method and its share of the
// "api" mix; a route outside the mix has none.
func TestRoutesListing(t *testing.T) {
	_, out, err := runCLI(t, "routes")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"route                  method", "activities             POST    /api/activities", "unmatched              GET     /static/app.js"} {
		if !strings.Contains(out, want) {
			t.Errorf("routes lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "unmatched ") && !strings.Contains(line, "      -  ") {
			t.Errorf("unmatched has a share of the mix: %q", line)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help", "--help"}, {"help", "check"}, {"check", "--help"}, {"http", "-h"}, {"accesslog", "--help"}, {"noop", "--help"}, {"noop-grpc", "--help"}, {"upstream", "--help"}, {"routes"}} {
		_, out, err := runCLI(t, args...)
		if err != nil || !strings.Contains(out, "ratelimit-bench") && !strings.Contains(out, "route") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
}
