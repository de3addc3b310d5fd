package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Code copied into a baseline's tree imports that tree's packages where
// they are, under pkg/ or internal/.
func TestRetargetToAnOlderLayout(t *testing.T) {
	src := t.TempDir()
	for _, d := range []string{"pkg/counter", "pkg/replicate", "internal/cli"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got := inTree(src, "internal/replicate"); got != "pkg/replicate" {
		t.Fatalf("inTree(internal/replicate) = %q, want pkg/replicate", got)
	}
	if got := inTree(src, "internal/cli"); got != "internal/cli" {
		t.Fatalf("inTree(internal/cli) = %q, want internal/cli", got)
	}
	if got := inTree(src, "internal/absent"); got != "internal/absent" {
		t.Fatalf("inTree(internal/absent) = %q, want it unchanged", got)
	}
	f := filepath.Join(src, "main.go")
	in := `import (
	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	rep "github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
)`
	if err := os.WriteFile(f, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := retarget(src, f); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.NewReplacer("internal/counter", "pkg/counter", "internal/replicate", "pkg/replicate").Replace(in)
	if string(b) != want {
		t.Fatalf("retargeted:\n%s\nwant:\n%s", b, want)
	}
}
