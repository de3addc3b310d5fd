package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
)

// errNoNATS: scripts/install-nats.sh could not provide nats-server.
var errNoNATS = errors.New("nats-server not available")

// natsServerBin installs nats-server (when this run has not yet) with
// scripts/install-nats.sh.
func (r *runner) natsServerBin(ctx context.Context) (string, error) {
	if r.bins.nats != "" {
		return r.bins.nats, nil
	}
	out, err := r.runTool(ctx, "install-nats", 5*time.Minute, nil, r.root, "bash", filepath.Join(r.root, "scripts", "install-nats.sh"))
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoNATS, err)
	}
	r.bins.nats = lastLine(out)
	if v, err := commandOutput(ctx, r.root, r.bins.nats, "--version"); err == nil {
		r.res.Env.NATSVersion = v
	}
	return r.bins.nats, nil
}

// startNATS starts a nats-server of this run on loopback ports of its own
// and waits until it is healthy; it returns the process and its client
// URL. The caller stops it.
func (r *runner) startNATS(ctx context.Context, name string) (*proc, string, error) {
	bin, err := r.natsServerBin(ctx)
	if err != nil {
		return nil, "", err
	}
	addrs, err := freeport.Addrs(2)
	if err != nil {
		return nil, "", err
	}
	_, port, _ := net.SplitHostPort(addrs[0])
	_, mon, _ := net.SplitHostPort(addrs[1])
	p, err := r.start(name, r.lifetime(), nil, bin, "-a", "127.0.0.1", "-p", port, "-m", mon)
	if err != nil {
		return nil, "", err
	}
	if err := waitHTTP200(ctx, p, "http://"+addrs[1]+"/healthz", 20*time.Second); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, "nats://" + addrs[0], nil
}
