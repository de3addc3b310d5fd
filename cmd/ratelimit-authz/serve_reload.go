package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/filewatch"
	"github.com/ratelimit-authz/ratelimit-authz/internal/node"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

// reloader re-reads the configuration when SIGHUP arrives or, with
// --watch-config, when the watched files change, and hands it to the
// node. A refused reload is logged with every problem located
// (file:line:column) and counted; the node keeps serving the last good
// configuration. It never stops the node.
type reloader struct {
	node    *node.Node
	load    func() (*configfile.Rules, error) // read and validated as at start; the node reads its RLS rules itself
	watcher *filewatch.Watcher                // nil: --watch-config off, or no file to watch
	log     *slog.Logger
}

// newWatcher watches the configuration files (the --config file when the
// configuration came from one, and any other format's paths) when watch
// is on; nil otherwise. It is made before the files are read, so an edit
// made while the node starts is not missed.
func newWatcher(watch bool, paths []string, log *slog.Logger) (*filewatch.Watcher, error) {
	if !watch || len(paths) == 0 {
		return nil, nil
	}
	w, err := filewatch.New(paths, filewatch.Options{}, log.With("component", "filewatch"))
	if err != nil {
		return nil, fmt.Errorf("watch the configuration: %w", err)
	}
	return w, nil
}

// run serves reload triggers until ctx ends. hup receives SIGHUP.
func (rl *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	var changes <-chan struct{}
	var wg sync.WaitGroup
	if rl.watcher != nil {
		changes = rl.watcher.Changes()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rl.watcher.Run(ctx); err != nil {
				rl.log.Error("configuration watch stopped; SIGHUP still reloads", "err", err)
			}
		}()
	}
	defer wg.Wait()
	for {
		var why string
		select {
		case <-ctx.Done():
			return
		case <-hup:
			why = "SIGHUP"
		case <-changes:
			why = "file changed"
		}
		rl.reload(ctx, why)
	}
}

func (rl *reloader) reload(ctx context.Context, why string) {
	start := time.Now()
	err := rl.node.ReloadFrom(ctx, rl.load)
	if err == nil {
		rl.log.Info("configuration reload applied", "trigger", why, "took", time.Since(start).Round(time.Microsecond))
		return
	}
	if ps, ok := problem.As(err); ok {
		rl.log.Error("configuration reload refused: the previous configuration keeps serving", "trigger", why, "problems", len(ps))
		for _, p := range ps {
			rl.log.Error("configuration problem", "problem", p.String())
		}
		return
	}
	rl.log.Error("configuration reload refused: the previous configuration keeps serving", "trigger", why, "err", err)
}

// notifyHUP delivers SIGHUP on the returned channel until stop is called;
// meanwhile SIGHUP no longer ends the process.
func notifyHUP() (hup <-chan os.Signal, stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	return c, func() { signal.Stop(c) }
}
