// Command exampleapp serves the example application that stands behind
// Envoy in docker-compose.yaml and the Kubernetes example: every request
// answers 200 with a small JSON body, except a login (a path ending in
// /login) without the right password, which gets 401 — the failure that
// Envoy's access log reports to ratelimit-authz.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/exampleapp"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "HTTP listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "exampleapp:", err)
		os.Exit(1)
	}
}

// resetEvery bounds the app's per-path hit counts (kept for the tests that
// embed it): a client sending distinct paths (say, one channel per
// request) grows them by at most what it sends in this long.
const resetEvery = 10 * time.Second

func serve(ctx context.Context, addr string) error {
	app := exampleapp.New()
	srv := &http.Server{Addr: addr, Handler: app, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	tick := time.NewTicker(resetEvery)
	defer tick.Stop()
	for running := true; running; {
		select {
		case err := <-errc:
			return err
		case <-tick.C:
			app.Reset()
		case <-ctx.Done():
			running = false
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
