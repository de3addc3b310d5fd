package image_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/deploy/image"
	"github.com/ratelimit-authz/ratelimit-authz/deploy/internal/serverbin"
)

// TestDockerfileMatchesImage: the Dockerfile's server stage (FROM scratch
// with the server's ENTRYPOINT, the last stage, so the one `docker build`
// without --target produces) declares the entrypoint, user, environment and
// ports of the image `make image` builds, and copies the root filesystem
// build-image writes.
func TestDockerfileMatchesImage(t *testing.T) {
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Instructions of each stage, continuation lines joined.
	type stage struct {
		from  string
		instr [][2]string // keyword, rest
	}
	var stages []*stage
	var cur string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if cur == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		cur += line
		kw, rest, _ := strings.Cut(cur, " ")
		cur = ""
		kw = strings.ToUpper(kw)
		if kw == "FROM" {
			stages = append(stages, &stage{from: rest})
			continue
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %s before FROM", kw)
		}
		s := stages[len(stages)-1]
		s.instr = append(s.instr, [2]string{kw, strings.TrimSpace(rest)})
	}
	var server *stage
	for _, s := range stages {
		for _, in := range s.instr {
			if in[0] == "ENTRYPOINT" && strings.Contains(in[1], "/ratelimit-authz") {
				server = s
			}
		}
	}
	if server == nil || !strings.HasPrefix(server.from, "scratch") {
		t.Fatalf("no FROM scratch stage with the server's ENTRYPOINT")
	}
	if stages[len(stages)-1] != server {
		t.Errorf("the server stage is not the last one: docker build without --target builds another")
	}
	var env []string
	var exposed []string
	got := map[string]string{}
	for _, in := range server.instr {
		switch in[0] {
		case "ENV":
			env = append(env, in[1])
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in[1])...)
		default:
			got[in[0]] = in[1]
		}
	}
	var entry []string
	if err := json.Unmarshal([]byte(got["ENTRYPOINT"]), &entry); err != nil || !slices.Equal(entry, image.Entrypoint()) {
		t.Errorf("ENTRYPOINT %s: want the exec form of %q (%v)", got["ENTRYPOINT"], image.Entrypoint(), err)
	}
	if want := fmt.Sprintf("%d:%d", image.UID, image.GID); got["USER"] != want {
		t.Errorf("USER %q, want %q", got["USER"], want)
	}
	if !slices.Equal(env, image.Env()) {
		t.Errorf("ENV %q, want %q", env, image.Env())
	}
	wantPorts := []string{fmt.Sprintf("%d/tcp", image.GRPCPort), fmt.Sprintf("%d/tcp", image.CheckPort), fmt.Sprintf("%d/tcp", image.HTTPPort)}
	if !slices.Equal(exposed, wantPorts) {
		t.Errorf("EXPOSE %q, want %q", exposed, wantPorts)
	}
	if !strings.Contains(got["COPY"], "/var/lib/ratelimit-authz") || !strings.Contains(string(b), "--layer-tar") {
		t.Errorf("the server stage does not copy the root filesystem build-image writes")
	}
	for _, l := range []string{"version", "revision", "source", "licenses"} {
		if !strings.Contains(got["LABEL"], "org.opencontainers.image."+l+"=") {
			t.Errorf("LABEL lacks org.opencontainers.image.%s", l)
		}
	}
}
