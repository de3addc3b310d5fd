package node

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/filewatch"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

// watchFiles returns a watcher of the configuration files of cfg (the
// rules file when the rules come from one, the RLS files), or nil when
// cfg.Watch is off or there is no file to watch. It is made before the
// files are read, so that an edit made while the node starts is not
// missed.
func watchFiles(cfg *Config, log *slog.Logger) (*filewatch.Watcher, error) {
	if !cfg.Watch {
		return nil, nil
	}
	var paths []string
	if f := cfg.RulesFile; f != nil && !f.Shipped() {
		paths = append(paths, f.Path)
	}
	if cfg.RLS != nil {
		paths = append(paths, cfg.RLS.Layout.WatchPaths()...)
	}
	if len(paths) == 0 {
		return nil, nil
	}
	w, err := filewatch.New(paths, filewatch.Options{}, log.With("component", "filewatch"))
	if err != nil {
		return nil, fmt.Errorf("watch the configuration: %w", err)
	}
	return w, nil
}

// loadRules reads the rules f names and logs what it read and what the
// rules trust that a client may set.
func loadRules(f *configfile.File, log *slog.Logger) (*configfile.Rules, error) {
	r, source, err := f.Load()
	if err != nil {
		return nil, err
	}
	if source != f.Path {
		log.Info("no configuration file; using the shipped default", "path", f.Path)
	}
	log.Info("configuration loaded", "source", source, "buckets", len(r.Buckets), "routes", len(r.Routes))
	for _, w := range r.TrustWarnings() {
		log.Warn("configuration trusts what a client may set; check-config --envoy checks the bootstrap in front", "warning", w)
	}
	return r, nil
}

// ReloadFiles reads the rules file (Config.RulesFile) and, when the node
// serves ShouldRateLimit, the RLS files, each as at start, and makes them
// the configuration served as one snapshot (see Reload); why (a file
// changed, SIGHUP) is logged with the outcome. A file with problems is
// refused, each problem logged, and the configuration in force keeps
// serving; the error says why.
func (n *Node) ReloadFiles(ctx context.Context, why string) error {
	start := time.Now()
	err := n.reloadFiles(ctx)
	if err == nil {
		n.log.Info("configuration reload applied", "trigger", why, "took", time.Since(start).Round(time.Microsecond))
		return nil
	}
	if ps, ok := problem.As(err); ok {
		n.log.Error("configuration reload refused: the previous configuration keeps serving", "trigger", why, "problems", len(ps))
		for _, p := range ps {
			n.log.Error("configuration problem", "problem", p.String())
		}
		return err
	}
	n.log.Error("configuration reload refused: the previous configuration keeps serving", "trigger", why, "err", err)
	return err
}

func (n *Node) reloadFiles(ctx context.Context) error {
	start := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var err error
	if n.cfg.RulesFile == nil {
		err = fmt.Errorf("node: reload: the rules come from no file")
	}
	var r *configfile.Rules
	if err == nil {
		r, err = loadRules(n.cfg.RulesFile, n.reloads.log)
	}
	var s Sources
	if err == nil {
		s.Rules = r
		s.RLS, err = loadRLS(n.cfg.RLS, n.reloads.log)
	}
	if err == nil {
		err = n.reload(ctx, s)
	}
	n.reloads.record(err, start)
	return err
}

// runWatch reloads the files each time the watcher sees them change,
// until ctx ends.
func (n *Node) runWatch(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := n.watcher.Run(ctx); err != nil {
			n.log.Error("configuration watch stopped; SIGHUP still reloads", "err", err)
		}
	}()
	defer func() { <-done }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.watcher.Changes():
			n.ReloadFiles(ctx, "file changed")
		}
	}
}
