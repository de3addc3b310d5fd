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

func serve(ctx context.Context, addr string) error {
	srv := &http.Server{Addr: addr, Handler: exampleapp.New(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
