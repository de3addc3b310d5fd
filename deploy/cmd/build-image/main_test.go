package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: the command writes the layout and the tarball, prints the same
// digest for the same inputs, and refuses bad arguments with a message.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	bin, conf := filepath.Join(dir, "bin"), filepath.Join(dir, "conf.yaml")
	if err := os.WriteFile(bin, []byte("\x7fELF stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, []byte("keys: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(n string) string {
		t.Helper()
		var out, errb bytes.Buffer
		args := []string{"--binary", bin, "--config", conf, "--version", "v1.2.3", "--revision", "abc",
			"--layout", filepath.Join(dir, "layout"+n), "--tarball", filepath.Join(dir, "image"+n+".tar"),
			"--layer-tar", filepath.Join(dir, "rootfs"+n+".tar")}
		if err := run(args, &out, &errb); err != nil {
			t.Fatalf("run: %v\n%s", err, errb.String())
		}
		return out.String()
	}
	a, b := build("1"), build("2")
	if a != b || !strings.HasPrefix(a, "ratelimit-authz:v1.2.3 sha256:") {
		t.Errorf("two runs printed %q and %q", a, b)
	}
	for _, f := range []string{"layout1/index.json", "layout1/oci-layout", "image1.tar", "rootfs1.tar"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	r1, _ := os.ReadFile(filepath.Join(dir, "rootfs1.tar"))
	r2, _ := os.ReadFile(filepath.Join(dir, "rootfs2.tar"))
	if !bytes.Equal(r1, r2) || len(r1) == 0 {
		t.Error("two root filesystem tars differ")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--binary", filepath.Join(dir, "missing")}, "read the binary"},
		{[]string{"--binary", bin, "--config", conf, "--layout", filepath.Join(dir, "layout1"), "--tarball", ""}, "exists"},
		{[]string{"--binary", bin, "--config", conf, "--layout", "", "--tarball", filepath.Join(dir, "bad.tar"), "--version", "bad tag!"}, "tag"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "not defined"},
	} {
		var out, errb bytes.Buffer
		err := run(tc.args, &out, &errb)
		if err == nil {
			t.Errorf("%q: no error", tc.args)
			continue
		}
		if !strings.Contains(err.Error()+errb.String(), tc.want) {
			t.Errorf("%q: %v, want it to say %q", tc.args, err, tc.want)
		}
	}
}
