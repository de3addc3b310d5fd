package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// checkout writes the tree of ref into a new folder under the run's
// temporary folder (git archive: no worktree is added to the repository)
// and returns the folder and the commit.
func (r *runner) checkout(ctx context.Context, ref, name string) (src, commit string, err error) {
	commit, err = commandOutput(ctx, r.root, "git", "rev-parse", "--verify", "--end-of-options", ref+"^{commit}")
	if err != nil {
		return "", "", fmt.Errorf("git rev-parse %s: %w (not in this clone?)", ref, err)
	}
	if src, err = os.MkdirTemp(r.tmp, name+"-"); err != nil {
		return "", commit, err
	}
	_, err = r.runTool(ctx, name+"-archive", 2*time.Minute, nil, r.root, "bash", "-c",
		`set -euo pipefail; git archive --format=tar "$1" | tar -x -C "$2"`, "bash", commit, src)
	return src, commit, err
}

// goBuild builds the package pkg of the module at dir into the binary out.
func (r *runner) goBuild(ctx context.Context, dir, out, pkg string) error {
	_, err := r.runTool(ctx, "build-"+filepath.Base(out), 5*time.Minute, []string{"CGO_ENABLED=0"}, dir, "go", "build", "-trimpath", "-o", out, pkg)
	return err
}

// modulePackage matches an import of one of this module's internal
// packages, the package's name in group 1.
var modulePackage = regexp.MustCompile(`"github\.com/ratelimit-authz/ratelimit-authz/internal/([a-z0-9]+)"`)

// inTree is rel (a package folder of this tree, such as
// "internal/replicate") as a baseline's tree at src has it: under pkg/
// when src is of a commit from before the packages moved to internal/.
func inTree(src, rel string) string {
	if _, err := os.Stat(filepath.Join(src, rel)); err != nil {
		if old := "pkg/" + strings.TrimPrefix(rel, "internal/"); old != rel {
			if _, err := os.Stat(filepath.Join(src, old)); err == nil {
				return old
			}
		}
	}
	return rel
}

// retarget rewrites, in the Go files copied from this tree into a
// baseline's tree at src, the imports of packages that tree has under
// pkg/, so that the copies build against the baseline's packages.
func retarget(src string, files ...string) error {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		out := modulePackage.ReplaceAllStringFunc(string(b), func(imp string) string {
			rel := "internal/" + modulePackage.FindStringSubmatch(imp)[1]
			return `"github.com/ratelimit-authz/ratelimit-authz/` + inTree(src, rel) + `"`
		})
		if out != string(b) {
			if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
