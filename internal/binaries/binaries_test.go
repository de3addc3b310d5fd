package binaries

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, EnvoyScript)); err != nil {
		t.Errorf("root %s has no %s: %v", root, EnvoyScript, err)
	}
	if got, err := ModuleRoot(filepath.Join(root, "internal", "binaries")); err != nil || got != root {
		t.Errorf("from a subfolder: %q, %v; want %q", got, err, root)
	}

	// Another module's go.mod (even one whose path merely starts the same)
	// is walked past.
	other := t.TempDir()
	write(t, filepath.Join(other, "go.mod"), "module "+ModulePath+"-fork\n\ngo 1.26\n", 0o644)
	if got, err := ModuleRoot(other); err == nil {
		t.Errorf("ModuleRoot of another module = %q, want an error", got)
	}
	for name, gomod := range map[string]string{
		"comments": "// module other\nmodule " + ModulePath + " // the one\n",
		"quoted":   "module \"" + ModulePath + "\"\n",
	} {
		dir := filepath.Join(other, name)
		write(t, filepath.Join(dir, "go.mod"), gomod, 0o644)
		if got, err := ModuleRoot(filepath.Join(dir, "deeper")); err != nil || got != dir {
			t.Errorf("%s: ModuleRoot = %q, %v; want %q", name, got, err, dir)
		}
	}
}

func TestEnvoy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root := t.TempDir()
	bin := filepath.Join(root, ".tools", "bin", "envoy")
	write(t, bin, "#!/bin/sh\n", 0o755)

	write(t, filepath.Join(root, EnvoyScript), "echo installing >&2\necho "+bin+"\n", 0o644)
	if got, err := Envoy(ctx, root); err != nil || got != bin {
		t.Errorf("Envoy = %q, %v; want %q", got, err, bin)
	}

	write(t, filepath.Join(root, EnvoyScript), "echo 'pip failed: no network' >&2; exit 1\n", 0o644)
	if _, err := Envoy(ctx, root); err == nil || !strings.Contains(err.Error(), "no network") {
		t.Errorf("failing installer: %v, want its stderr", err)
	}

	write(t, filepath.Join(root, EnvoyScript), "echo "+filepath.Join(root, "nope")+"\n", 0o644)
	if _, err := Envoy(ctx, root); err == nil {
		t.Error("installer printing a missing path: no error")
	}
}

func TestBuildServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := t.TempDir()
	write(t, filepath.Join(root, "go.mod"), "module example.com/fake\n\ngo 1.26\n", 0o644)
	write(t, filepath.Join(root, ServerPackage, "main.go"), "package main\n\nfunc main() {}\n", 0o644)
	out := filepath.Join(t.TempDir(), "ratelimit-authz")
	if err := BuildServer(ctx, root, out); err != nil {
		t.Fatal(err)
	}
	if err := Executable(out); err != nil {
		t.Error(err)
	}

	write(t, filepath.Join(root, ServerPackage, "main.go"), "package main\n\nfunc main() { undefinedThing() }\n", 0o644)
	if err := BuildServer(ctx, root, out); err == nil || !strings.Contains(err.Error(), "undefinedThing") {
		t.Errorf("broken build: %v, want the compiler's message", err)
	}
}

func TestExecutable(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "data"), "x", 0o644)
	for _, p := range []string{dir, filepath.Join(dir, "data"), filepath.Join(dir, "missing")} {
		if err := Executable(p); err == nil {
			t.Errorf("Executable(%s) = nil", p)
		}
	}
}

// fakeTB records how InstalledEnvoy ends a test instead of ending it.
type fakeTB struct{ fatal, skip string }

func (f *fakeTB) Helper()                        {}
func (f *fakeTB) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }
func (f *fakeTB) Skipf(format string, a ...any)  { f.skip = fmt.Sprintf(format, a...) }

func TestInstalledEnvoy(t *testing.T) {
	dir := t.TempDir()
	bin, data := filepath.Join(dir, "envoy"), filepath.Join(dir, "data")
	write(t, bin, "#!/bin/sh\n", 0o755)
	write(t, data, "x", 0o644)

	t.Setenv("E2E_ENVOY_BIN", bin)
	var ok fakeTB
	if got := InstalledEnvoy(&ok); got != bin || ok.fatal != "" || ok.skip != "" {
		t.Errorf("InstalledEnvoy = %q (%+v), want %s", got, ok, bin)
	}
	t.Setenv("E2E_ENVOY_BIN", data)
	t.Setenv("CI", "")
	var skipped fakeTB
	if InstalledEnvoy(&skipped); skipped.skip == "" || skipped.fatal != "" {
		t.Errorf("not executable, not CI: %+v, want a skip", skipped)
	}
	t.Setenv("CI", "true")
	var failed fakeTB
	if InstalledEnvoy(&failed); failed.fatal == "" || !strings.Contains(failed.fatal, "not available") {
		t.Errorf("not executable under CI: %+v, want a failure", failed)
	}

	// Without the variable: the module's .tools/bin/envoy.
	t.Setenv("E2E_ENVOY_BIN", "")
	t.Setenv("CI", "")
	var def fakeTB
	got := InstalledEnvoy(&def)
	root, err := ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, ".tools", "bin", "envoy"); def.skip == "" && got != want {
		t.Errorf("InstalledEnvoy = %q, want %s", got, want)
	}
}
