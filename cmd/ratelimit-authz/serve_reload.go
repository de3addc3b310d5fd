package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/ratelimit-authz/ratelimit-authz/internal/node"
)

// reloadOnHUP reloads n's configuration files at each SIGHUP (received on
// hup) until ctx ends; the node logs each outcome.
func reloadOnHUP(ctx context.Context, n *node.Node, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			n.ReloadFiles(ctx, "SIGHUP")
		}
	}
}

// notifyHUP delivers SIGHUP on the returned channel until stop is called;
// meanwhile SIGHUP no longer ends the process.
func notifyHUP() (hup <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	return c, func() { signal.Stop(c) }
}
