package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// gate is an authz service that counts its calls and, while closed, holds
// every check until release.
type gate struct {
	authv3.UnimplementedAuthorizationServer
	calls, inflight, max atomic.Int64
	open                 chan struct{}
	once                 sync.Once
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

func (g *gate) Check(ctx context.Context, _ *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	g.calls.Add(1)
	n := g.inflight.Add(1)
	defer g.inflight.Add(-1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-g.open:
	case <-ctx.Done():
	}
	return &authv3.CheckResponse{}, nil
}

// start runs a server and returns it with its metrics registry.
func start(t *testing.T, cfg server.Config, svc server.Services) (*server.Server, *prometheus.Registry) {
	t.Helper()
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:0"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = "127.0.0.1:0"
	}
	reg := prometheus.NewRegistry()
	srv, err := server.New(cfg, svc, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("Run did not return")
		}
	})
	return srv, reg
}

// metric is the value of a counter or gauge with the given listener label;
// the series must exist.
func metric(t *testing.T, reg prometheus.Gatherer, name, listener string) float64 {
	t.Helper()
	return scrape.Must(t, reg, name, "listener", listener)
}

func dialGRPC(t *testing.T, addr string, opts ...grpc.DialOption) authv3.AuthorizationClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn)
}

// A client that ignores SETTINGS_MAX_CONCURRENT_STREAMS has the streams
// over the bound refused; the ones within it are served.
func TestStreamsPerConnectionHostile(t *testing.T) {
	g := newGate()
	g.release()
	srv, _ := start(t, server.Config{Bounds: server.Bounds{MaxConcurrentStreams: 3}}, server.Services{Authz: g})
	c := dialH2(t, srv.GRPCAddr().String())
	if got := c.settings[http2.SettingMaxConcurrentStreams]; got != 3 {
		t.Fatalf("advertised max concurrent streams %d, want 3", got)
	}
	// Headers without a message: each stream stays open. The server reads
	// frames in order, so 1, 3 and 5 are open when 7 and 9 arrive.
	for id := uint32(1); id <= 9; id += 2 {
		c.openCheck(id)
	}
	refused := map[uint32]bool{}
	for len(refused) < 2 {
		f := c.waitFrame(5*time.Second, "RST_STREAM of streams 7 and 9", func(f http2.Frame) bool {
			_, ok := f.(*http2.RSTStreamFrame)
			return ok
		}).(*http2.RSTStreamFrame)
		if f.ErrCode != http2.ErrCodeRefusedStream || f.StreamID < 7 {
			t.Fatalf("stream %d reset with %v, want streams 7 and 9 REFUSED_STREAM", f.StreamID, f.ErrCode)
		}
		refused[f.StreamID] = true
	}
	// The three admitted streams are served to the end.
	req, _ := proto.Marshal(&authv3.CheckRequest{})
	for id := uint32(1); id <= 5; id += 2 {
		c.sendMessage(id, req)
	}
	ended := map[uint32]bool{}
	for len(ended) < 3 {
		f := c.waitFrame(5*time.Second, "responses", func(f http2.Frame) bool {
			h, ok := f.(*http2.MetaHeadersFrame)
			return ok && h.StreamEnded()
		}).(*http2.MetaHeadersFrame)
		if f.StreamID > 5 {
			t.Fatalf("refused stream %d answered", f.StreamID)
		}
		for _, h := range f.RegularFields() {
			if h.Name == "grpc-status" && h.Value != "0" {
				t.Errorf("stream %d: grpc-status %s", f.StreamID, h.Value)
			}
		}
		ended[f.StreamID] = true
	}
	if n := g.calls.Load(); n != 3 {
		t.Errorf("%d checks reached the service, want 3", n)
	}
}

// A gRPC client, which honours the advertised bound, waits instead: all
// its checks succeed, never more than the bound at once.
func TestStreamsPerConnectionQueued(t *testing.T) {
	g := newGate()
	srv, _ := start(t, server.Config{Bounds: server.Bounds{MaxConcurrentStreams: 3}}, server.Services{Authz: g})
	client := dialGRPC(t, srv.GRPCAddr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, 10)
	for range 10 {
		go func() { _, err := client.Check(ctx, &authv3.CheckRequest{}); errs <- err }()
	}
	waitFor(t, func() bool { return g.inflight.Load() == 3 })
	g.release()
	for range 10 {
		if err := <-errs; err != nil {
			t.Errorf("check: %v", err)
		}
	}
	if m := g.max.Load(); m != 3 {
		t.Errorf("at most %d checks in flight on one connection, want 3", m)
	}
}

// checkOfSize is a CheckRequest whose encoding is about n bytes (a body).
func checkOfSize(n int) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: "/login", Body: strings.Repeat("a", n)},
	}}}
}

func TestMaxReceiveSize(t *testing.T) {
	g := newGate()
	g.release()
	srv, _ := start(t, server.Config{Bounds: server.Bounds{MaxRecvMsgBytes: 64 << 10}}, server.Services{Authz: g})
	client := dialGRPC(t, srv.GRPCAddr().String(), grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(16<<20)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, checkOfSize(60<<10)); err != nil {
		t.Errorf("60 KiB check under a 64 KiB bound: %v", err)
	}
	for _, n := range []int{65 << 10, 8 << 20} {
		_, err := client.Check(ctx, checkOfSize(n))
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%d-byte check: %v, want RESOURCE_EXHAUSTED", n, err)
		}
	}
	if n := g.calls.Load(); n != 1 {
		t.Errorf("%d checks reached the service, want 1", n)
	}
}

// The default bound holds the largest CheckRequest Envoy sends with its
// default limits: 60 KiB of request headers (max_request_headers_kb), the
// path counted twice (in the headers and on its own), and the 8 KiB body
// the shipped bootstrap buffers.
func TestDefaultReceiveSizeFitsEnvoy(t *testing.T) {
	g := newGate()
	g.release()
	srv, _ := start(t, server.Config{}, server.Services{Authz: g})
	client := dialGRPC(t, srv.GRPCAddr().String())
	path := "/" + strings.Repeat("p", 30<<10)
	headers := map[string]string{":path": path, ":method": "POST", "cookie": strings.Repeat("c", 30<<10)}
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "192.0.2.1"},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: path, Headers: headers, Body: strings.Repeat("b", 8<<10),
		}},
	}}
	if size := proto.Size(req); size < 98<<10 {
		t.Fatalf("request of %d bytes: too small to show anything", size)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, req); err != nil {
		t.Errorf("largest default Envoy check (%d bytes): %v", proto.Size(req), err)
	}
}

// A gRPC request whose own HTTP/2 header list is over the bound never
// reaches a service, whether the client honours the advertised
// SETTINGS_MAX_HEADER_LIST_SIZE or not. An HPACK bomb (one 1 KiB header
// indexed once and repeated by reference: 1 KiB on the wire, 40 KiB
// decoded) has its stream reset; a list spread over CONTINUATION frames,
// or one header larger than the bound, ends the connection. The server
// serves the next client.
func TestMaxHeaderListSize(t *testing.T) {
	g := newGate()
	g.release()
	srv, _ := start(t, server.Config{}, server.Services{Authz: g})
	addr := srv.GRPCAddr().String()
	c := dialH2(t, addr)
	if got := c.settings[http2.SettingMaxHeaderListSize]; got != server.DefaultMaxHeaderListBytes {
		t.Errorf("advertised header list size %d, want %d", got, server.DefaultMaxHeaderListBytes)
	}
	if got := c.settings[http2.SettingMaxConcurrentStreams]; got != server.DefaultMaxConcurrentStreams {
		t.Errorf("advertised max concurrent streams %d, want %d", got, server.DefaultMaxConcurrentStreams)
	}
	junk := hpack.HeaderField{Name: "x-junk", Value: strings.Repeat("j", 1<<10)}
	var bomb []hpack.HeaderField
	for range 40 {
		bomb = append(bomb, junk)
	}
	c.openCheck(1, bomb...)
	f := c.waitFrame(5*time.Second, "RST_STREAM", func(f http2.Frame) bool {
		_, ok := f.(*http2.RSTStreamFrame)
		return ok
	}).(*http2.RSTStreamFrame)
	if f.StreamID != 1 {
		t.Errorf("reset stream %d", f.StreamID)
	}
	// The connection is still good for a request within the bound.
	c.openCheck(3)
	req, _ := proto.Marshal(&authv3.CheckRequest{})
	c.sendMessage(3, req)
	c.waitFrame(5*time.Second, "the response to stream 3", func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamID == 3 && h.StreamEnded()
	})

	var spread []hpack.HeaderField
	for i := range 40 {
		spread = append(spread, hpack.HeaderField{Name: fmt.Sprintf("x-junk-%d", i), Value: junk.Value})
	}
	for name, fields := range map[string][]hpack.HeaderField{
		"40 KiB over CONTINUATION frames": spread,
		"one 40 KiB header":               {{Name: "x-junk", Value: strings.Repeat("j", 40<<10)}},
	} {
		h := dialH2(t, addr)
		h.tryOpenCheck(1, fields...) // the server may close the connection mid-write
		if _, err := h.readUntil(5*time.Second, func(f http2.Frame) bool {
			_, ok := f.(*http2.MetaHeadersFrame)
			return ok
		}); err == nil {
			t.Errorf("%s: answered", name)
		}
	}

	client := dialGRPC(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.Check(ctx, &authv3.CheckRequest{}); err != nil {
		t.Errorf("check after the oversized headers: %v", err)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, "x-junk", strings.Repeat("j", 40<<10))
	if _, err := client.Check(ctx, &authv3.CheckRequest{}); err == nil {
		t.Error("a 40 KiB header list accepted")
	}
	if n := g.calls.Load(); n != 2 {
		t.Errorf("%d checks reached the service, want 2 (within the bound)", n)
	}
}

// Keepalive pings faster than the policy allows close the connection with
// GOAWAY ENHANCE_YOUR_CALM; the server stays up for others.
func TestPingFlood(t *testing.T) {
	srv, _ := start(t, server.Config{}, server.Services{Authz: allowAll{}})
	c := dialH2(t, srv.GRPCAddr().String())
	for i := range 20 {
		if err := c.fr.WritePing(false, [8]byte{byte(i)}); err != nil {
			break // the server may already have closed the connection
		}
	}
	f := c.waitFrame(5*time.Second, "GOAWAY", func(f http2.Frame) bool {
		_, ok := f.(*http2.GoAwayFrame)
		return ok
	}).(*http2.GoAwayFrame)
	if f.ErrCode != http2.ErrCodeEnhanceYourCalm || string(f.DebugData()) != "too_many_pings" {
		t.Errorf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", f.ErrCode, f.DebugData())
	}
	c.waitClosed(5 * time.Second)
	if err := check(t, srv.GRPCAddr().String(), insecure.NewCredentials()); err != nil {
		t.Errorf("check after the flood: %v", err)
	}
}

// Connections over the bound are closed at once and counted; a slot comes
// back when a connection closes.
func TestMaxConnections(t *testing.T) {
	srv, reg := start(t, server.Config{Bounds: server.Bounds{MaxConnections: 2}}, server.Services{Authz: allowAll{}})
	addr := srv.GRPCAddr().String()
	first := dialH2(t, addr)
	dialH2(t, addr)
	if _, err := tryH2(t, addr); err == nil {
		t.Fatal("a third connection was served with a bound of 2")
	}
	if n := metric(t, reg, "ratelimit_authz_server_connections_refused_total", "grpc"); n != 1 {
		t.Errorf("connections_refused_total %v, want 1", n)
	}
	if n := metric(t, reg, "ratelimit_authz_server_connections_open", "grpc"); n != 2 {
		t.Errorf("connections_open %v, want 2", n)
	}
	first.conn.Close()
	waitFor(t, func() bool { return metric(t, reg, "ratelimit_authz_server_connections_open", "grpc") == 1 })
	dialH2(t, addr)
}

// A connection that never completes its handshake, or sits idle after it,
// gives its slot back.
func TestHandshakeAndIdleTimeouts(t *testing.T) {
	srv, reg := start(t, server.Config{Bounds: server.Bounds{
		MaxConnections: 1, HandshakeTimeout: 300 * time.Millisecond, MaxConnectionIdle: 300 * time.Millisecond,
	}}, server.Services{Authz: allowAll{}})
	addr := srv.GRPCAddr().String()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	silent := &h2Client{t: t, conn: conn, fr: http2.NewFramer(conn, conn)}
	silent.waitClosed(5 * time.Second) // sent nothing: closed after the handshake timeout
	waitFor(t, func() bool { return metric(t, reg, "ratelimit_authz_server_connections_open", "grpc") == 0 })

	idle := dialH2(t, addr)
	f := idle.waitFrame(5*time.Second, "GOAWAY of an idle connection", func(f http2.Frame) bool {
		_, ok := f.(*http2.GoAwayFrame)
		return ok
	}).(*http2.GoAwayFrame)
	if f.ErrCode != http2.ErrCodeNo {
		t.Errorf("idle GOAWAY %v", f.ErrCode)
	}
	idle.waitClosed(5 * time.Second)
	waitFor(t, func() bool {
		c, err := tryH2(t, addr)
		if err == nil {
			c.conn.Close()
		}
		return err == nil
	})
}

func TestLimitsErrors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name   string
		limits server.Bounds
		want   string
	}{
		{"negative connections", server.Bounds{MaxConnections: -1}, "negative"},
		{"negative size", server.Bounds{MaxRecvMsgBytes: -1}, "negative"},
		{"no bound", server.Bounds{MaxRecvMsgBytes: 1 << 30}, "at most"},
		{"negative keepalive", server.Bounds{KeepaliveMinTime: -time.Second}, "negative"},
	} {
		_, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Bounds: tc.limits},
			server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), log)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
