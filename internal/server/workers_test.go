package server_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// workerProbe answers every check and records whether it ran on one of
// grpc-go's stream workers, from its own goroutine's stack. While
// hold is open, each check waits until every check of the batch has
// arrived: a check queued behind a busy worker would never arrive.
type workerProbe struct {
	mu       sync.Mutex
	onWorker int
	calls    int
	batch    int
	arrived  chan struct{}
	release  chan struct{}
}

func (p *workerProbe) Check(ctx context.Context, _ *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	buf := make([]byte, 16<<10)
	stack := buf[:runtime.Stack(buf, false)]
	p.mu.Lock()
	p.calls++
	if bytes.Contains(stack, []byte("grpc.(*Server).serverWorker")) {
		p.onWorker++
	}
	hold := p.batch > 0
	p.mu.Unlock()
	if hold {
		p.arrived <- struct{}{}
		select {
		case <-p.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return allowAll{}.Check(ctx, nil)
}

func (p *workerProbe) counts() (onWorker, calls int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.onWorker, p.calls
}

func dialCheck(t *testing.T, srv *server.Server) authv3.AuthorizationClient {
	t.Helper()
	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn)
}

// TestStreamWorkers: by default checks run on the server's long-lived
// stream workers; with workers off, each on a goroutine of its own.
func TestStreamWorkers(t *testing.T) {
	for _, tc := range []struct {
		name       string
		workers    int
		wantWorker bool
	}{
		{"default", 0, true},
		{"set", 3, true},
		{"off", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &workerProbe{}
			srv, _ := start(t, server.Config{StreamWorkers: tc.workers}, server.Services{Authz: p})
			client := dialCheck(t, srv)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			const n = 20
			for range n {
				if _, err := client.Check(ctx, benchRequest()); err != nil {
					t.Fatal(err)
				}
			}
			onWorker, calls := p.counts()
			if calls != n {
				t.Fatalf("%d checks answered, want %d", calls, n)
			}
			// One check at a time: a worker is free for each (a worker
			// only misses a check while it is still starting).
			if got := onWorker > 0; got != tc.wantWorker {
				t.Errorf("%d of %d checks on a stream worker; want some: %v", onWorker, n, tc.wantWorker)
			}
			if !tc.wantWorker && onWorker != 0 {
				t.Errorf("%d checks on a stream worker with workers off", onWorker)
			}
		})
	}
}

// TestStreamWorkersBusy: more checks in flight than workers are all
// served at once, the extra ones on goroutines of their own; none waits
// for a busy worker.
func TestStreamWorkersBusy(t *testing.T) {
	const workers, inFlight = 1, 4
	p := &workerProbe{batch: inFlight, arrived: make(chan struct{}, inFlight), release: make(chan struct{})}
	srv, _ := start(t, server.Config{StreamWorkers: workers}, server.Services{Authz: p})
	client := dialCheck(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errs := make(chan error, inFlight)
	for range inFlight {
		go func() {
			_, err := client.Check(ctx, benchRequest())
			errs <- err
		}()
	}
	for i := range inFlight {
		select {
		case <-p.arrived:
		case <-ctx.Done():
			t.Fatalf("%d of %d checks reached the handler: the others wait for a busy worker", i, inFlight)
		}
	}
	close(p.release)
	for range inFlight {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if onWorker, calls := p.counts(); calls != inFlight || onWorker > workers {
		t.Errorf("%d checks, %d on a worker: want %d checks, at most %d on a worker", calls, onWorker, inFlight, workers)
	}
}

func TestStreamWorkersBound(t *testing.T) {
	_, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", StreamWorkers: 1 << 20},
		server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "stream workers") {
		t.Fatalf("a million stream workers: %v, want an error", err)
	}
}
