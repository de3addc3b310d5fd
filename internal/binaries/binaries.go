// Package binaries finds and builds the programs that the end-to-end tests
// and the demo run: the repository they live in, the pinned Envoy (installed
// by scripts/install-envoy.sh into .tools/), and the ratelimit-authz server
// or another main package of the module (go build). Each call runs external commands under the caller's context
// and returns an error carrying their output; nothing is cached here.
package binaries

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ModulePath is the module whose root ModuleRoot looks for.
const ModulePath = "github.com/ratelimit-authz/ratelimit-authz"

// EnvoyScript installs the pinned Envoy; relative to the module root.
const EnvoyScript = "scripts/install-envoy.sh"

// ServerPackage is the ratelimit-authz main package; relative to the
// module root.
const ServerPackage = "./cmd/ratelimit-authz"

// ModuleRoot returns the nearest folder at or above dir whose go.mod
// declares ModulePath.
func ModuleRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("binaries: %w", err)
	}
	for d := dir; ; {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && declares(b, ModulePath) {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("binaries: no go.mod of %s at or above %s", ModulePath, dir)
		}
		d = parent
	}
}

func declares(gomod []byte, module string) bool {
	for line := range strings.Lines(string(gomod)) {
		line, _, _ = strings.Cut(line, "//")
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == module {
			return true
		}
	}
	return false
}

// Envoy runs the module's scripts/install-envoy.sh, which installs the
// pinned Envoy unless it is already there, and returns the path the script
// prints as its last line. A cold install downloads a wheel from PyPI:
// give ctx minutes, not seconds.
func Envoy(ctx context.Context, root string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, EnvoyScript))
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("binaries: %s: %w\n%s", EnvoyScript, err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	path := strings.TrimSpace(lines[len(lines)-1])
	if err := executable(path); err != nil {
		return "", fmt.Errorf("binaries: %s printed %q: %w", EnvoyScript, path, err)
	}
	return path, nil
}

// BuildServer builds ./cmd/ratelimit-authz of the module at root into out
// with the go command on PATH.
func BuildServer(ctx context.Context, root, out string) error {
	return Build(ctx, root, ServerPackage, out)
}

// Build builds the main package pkg (like "./cmd/ratelimit-demo") of the
// module at root into out with the go command on PATH.
func Build(ctx context.Context, root, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("binaries: go build %s: %w\n%s", pkg, err, bytes.TrimSpace(b))
	}
	return nil
}

// Executable returns nil when path is a regular file with an execute bit,
// and an error saying why not otherwise: a check before starting a binary
// that a user named, so a typo fails with a clear message.
func Executable(path string) error {
	if err := executable(path); err != nil {
		return fmt.Errorf("binaries: %s: %w", path, err)
	}
	return nil
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("not an executable file (mode %v)", fi.Mode())
	}
	return nil
}

// TB is the part of testing.TB that InstalledEnvoy uses; declared here so
// that this package, which the demo links, does not import testing.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// InstalledEnvoy is, for a package's own tests, the Envoy that `make tools`
// installed into .tools/bin of the module (or $E2E_ENVOY_BIN), without
// installing one: when it is missing the test is skipped, and failed
// under CI=true.
func InstalledEnvoy(t TB) string {
	t.Helper()
	envoy := os.Getenv("E2E_ENVOY_BIN")
	if envoy == "" {
		root, err := ModuleRoot(".")
		if err != nil {
			t.Fatalf("binaries: %v", err)
		}
		envoy = filepath.Join(root, ".tools", "bin", "envoy")
	}
	if err := Executable(envoy); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("envoy not available: %v", err)
		}
		t.Skipf("envoy not available (make tools installs it): %v", err)
	}
	return envoy
}
