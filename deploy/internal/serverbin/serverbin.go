// Package serverbin builds the ratelimit-authz server the way `make build`
// and `make image` do (static, CGO_ENABLED=0, -trimpath, version stamped)
// and reads what the binary accepts from its own help text, so that the
// packaging tests check the manifests against the real binary rather than
// a hand-kept list.
package serverbin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
)

// buildTimeout bounds one go build of the server.
const buildTimeout = 5 * time.Minute

// RepoRoot returns the root of the server's module (the repository), at or
// above dir.
func RepoRoot(dir string) (string, error) {
	return binaries.ModuleRoot(dir)
}

// Build builds ./cmd/ratelimit-authz of the repository at root into out as
// a static binary stamped with version.
func Build(ctx context.Context, root, out, version string) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath",
		"-ldflags", "-s -w -X main.version="+version, "-o", out, binaries.ServerPackage)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("serverbin: go build %s: %w\n%s", binaries.ServerPackage, err, bytes.TrimSpace(b))
	}
	return nil
}

// Flag is one flag of a subcommand, as its help text shows it.
type Flag struct {
	Name    string // without the dash
	Env     string // the environment variable that sets it ("" when none)
	Default string // the default shown, unquoted ("" when none)
}

// Surface is what one subcommand of the binary accepts: its flags, every
// environment variable its help names (those of flags and the ones only the
// prose names, such as secrets that are never flags) and the HTTP paths it
// names.
type Surface struct {
	Flags map[string]Flag
	Env   map[string]bool
	Paths map[string]bool
}

// Help runs `bin COMMAND --help` and parses its output.
func Help(ctx context.Context, bin, command string) (*Surface, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, command, "--help")
	cmd.Env = []string{} // the help must not depend on the caller's environment
	out, err := cmd.CombinedOutput()
	// flag's -help exits 0 after printing the usage; anything else is a
	// broken binary.
	if err != nil {
		return nil, fmt.Errorf("serverbin: %s %s --help: %w\n%s", bin, command, err, out)
	}
	s, err := ParseHelp(string(out))
	if err != nil {
		return nil, fmt.Errorf("serverbin: %s %s --help: %w", bin, command, err)
	}
	return s, nil
}

var (
	// "  -grpc-addr address" or "  -backend backend" or "  -grpc-max-streams int".
	flagLine = regexp.MustCompile(`^  -([a-z0-9][a-z0-9-]*)(?: [a-zA-Z]+)?$`)
	envRef   = regexp.MustCompile(`\(env ([A-Z][A-Z0-9_]*)\)`)
	defRef   = regexp.MustCompile(`\(default ("[^"]*"|[^)]*)\)$`)
	// Environment variables the prose names: the product's own prefix and
	// the NATS client's variables.
	proseEnv = regexp.MustCompile(`\b(?:RATELIMIT_AUTHZ_|NATS_|DATABASE_URL|RATE_LIMIT_)[A-Z0-9_]*\b`)
	pathRef  = regexp.MustCompile(`(?:^|[\s(,])(/[a-z][a-z0-9/_]*)`)
)

// ParseHelp reads the usage text of a subcommand (Go's flag package
// PrintDefaults layout: a "  -name type" line, then indented description
// lines ending in "(env NAME)" and "(default …)").
func ParseHelp(text string) (*Surface, error) {
	s := &Surface{Flags: map[string]Flag{}, Env: map[string]bool{}, Paths: map[string]bool{}}
	var cur *Flag
	flush := func() {
		if cur != nil {
			s.Flags[cur.Name] = *cur
			cur = nil
		}
	}
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		for _, m := range proseEnv.FindAllString(line, -1) {
			s.Env[m] = true
		}
		for _, m := range pathRef.FindAllStringSubmatch(line, -1) {
			p := strings.TrimRight(m[1], "/")
			if p != "" && !strings.Contains(p, "//") {
				s.Paths[p] = true
			}
		}
		if m := flagLine.FindStringSubmatch(line); m != nil {
			flush()
			cur = &Flag{Name: m[1]}
			continue
		}
		if cur == nil || !strings.HasPrefix(line, "    \t") {
			flush()
			continue
		}
		if m := envRef.FindStringSubmatch(line); m != nil {
			cur.Env = m[1]
			s.Env[m[1]] = true
		}
		if m := defRef.FindStringSubmatch(line); m != nil {
			cur.Default = strings.Trim(m[1], `"`)
		}
	}
	flush()
	if len(s.Flags) == 0 {
		return nil, fmt.Errorf("no flags in the help text:\n%s", text)
	}
	return s, nil
}

// EnvFlag returns the flag that env sets, if any.
func (s *Surface) EnvFlag(env string) (Flag, bool) {
	for _, f := range s.Flags {
		if f.Env == env {
			return f, true
		}
	}
	return Flag{}, false
}

// SortedEnv lists the environment variables, sorted (for messages).
func (s *Surface) SortedEnv() []string {
	var out []string
	for e := range s.Env {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// TestBinary builds the server into dir (a test's temporary folder) and
// returns its path; for a TestMain that builds once per test binary.
func TestBinary(ctx context.Context, dir string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root, err := RepoRoot(wd)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "ratelimit-authz")
	if err := Build(ctx, root, bin, "test"); err != nil {
		return "", err
	}
	return bin, nil
}

// Main is the TestMain of a test binary whose tests run the server: it
// builds the server once (TestBinary) into a temporary folder, sets *bin
// to its path, runs the tests, removes the folder and exits with their
// code. A failed build fails the whole test binary.
func Main(m *testing.M, bin *string) {
	dir, err := os.MkdirTemp("", "serverbin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *bin, err = TestBinary(context.Background(), dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// Decision is what one Check answered.
type Decision struct {
	Allowed    bool
	HTTPStatus int32  // of a denial
	RetryAfter string // a denial's Retry-After header
}

// CheckToken sends one Check of the legacy token API (bucket token_create
// of the shipped configuration, keyed by the client IP that Envoy's
// x-envoy-external-address names) to a node's gRPC address.
func CheckToken(ctx context.Context, client authv3.AuthorizationClient, clientIP string) (Decision, error) {
	resp, err := client.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/api/v1/tokens",
			Headers: map[string]string{":method": "POST", ":path": "/api/v1/tokens", "x-envoy-external-address": clientIP},
		}},
	}})
	if err != nil {
		return Decision{}, fmt.Errorf("serverbin: check: %w", err)
	}
	if resp.GetStatus().GetCode() == int32(codes.OK) {
		return Decision{Allowed: true}, nil
	}
	d := Decision{HTTPStatus: int32(resp.GetDeniedResponse().GetStatus().GetCode())}
	for _, h := range resp.GetDeniedResponse().GetHeaders() {
		if strings.EqualFold(h.GetHeader().GetKey(), "retry-after") {
			d.RetryAfter = h.GetHeader().GetValue()
		}
	}
	return d, nil
}

// DenyToken sends token Checks for clientIP until one is denied, at most
// max, and returns how many were allowed before it and the denial. Call it
// away from a minute boundary (the shipped token_create window).
func DenyToken(ctx context.Context, addr, clientIP string, max int) (allowed int, denial Decision, err error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, Decision{}, fmt.Errorf("serverbin: dial %s: %w", addr, err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	for range max {
		d, err := CheckToken(ctx, client, clientIP)
		if err != nil {
			return allowed, Decision{}, err
		}
		if !d.Allowed {
			return allowed, d, nil
		}
		allowed++
	}
	return allowed, Decision{}, fmt.Errorf("serverbin: %d checks of %s allowed, none denied", allowed, clientIP)
}

// AwayFromMinuteEdge sleeps past the next minute boundary when fewer than
// 10 s of the current minute are left, so that a burst stays in one window.
func AwayFromMinuteEdge() {
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 10*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
}
