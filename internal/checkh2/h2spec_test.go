package checkh2_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// installH2spec runs scripts/install-h2spec.sh once per test binary; the
// script prints the binary's path as its last line.
var installH2spec = sync.OnceValues(func() (string, error) {
	root, err := binaries.ModuleRoot(".")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "install-h2spec.sh"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/install-h2spec.sh: %w\n%s", err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	path := strings.TrimSpace(lines[len(lines)-1])
	if err := binaries.Executable(path); err != nil {
		return "", fmt.Errorf("scripts/install-h2spec.sh printed %q: %w", path, err)
	}
	return path, nil
})

// h2specBinary returns $H2SPEC_BIN or the pinned h2spec; a missing one
// skips the test, except under CI=true, where it fails it.
func h2specBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("H2SPEC_BIN"); p != "" {
		return p
	}
	p, err := installH2spec()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("h2spec not available: %v", err)
		}
		t.Skipf("h2spec not available: %v (skipped; fails under CI=true)", err)
	}
	return p
}

// h2specRun runs every h2spec case against addr and returns each case's
// outcome ("passed", "failed", "skipped") by "section: description".
func h2specRun(t *testing.T, bin, addr string) map[string]string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(t.TempDir(), "h2spec.xml")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-h", host, "-p", port, "-P", checkPath, "-o", "2", "-j", report) // h2spec's default timeout
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("h2spec against %s: %v\n%s", addr, ctx.Err(), out)
	}
	b, rerr := os.ReadFile(report)
	if rerr != nil {
		t.Fatalf("h2spec against %s: %v (exit %v)\n%s", addr, rerr, err, out)
	}
	var r struct {
		Suites []struct {
			Cases []struct {
				Package string    `xml:"package,attr"`
				Class   string    `xml:"classname,attr"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
				Skipped *struct{} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	// A failure's text quotes frames as they came, control bytes and all,
	// which XML does not allow.
	b = bytes.Map(func(r rune) rune {
		if r < 0x20 && r != '\t' && r != '\n' && r != '\r' {
			return -1
		}
		return r
	}, b)
	if err := xml.Unmarshal(b, &r); err != nil {
		t.Fatalf("h2spec's report: %v", err)
	}
	res := map[string]string{}
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			if c.Package == "" {
				continue
			}
			v := "passed"
			switch {
			case c.Failure != nil || c.Error != nil:
				v = "failed"
			case c.Skipped != nil:
				v = "skipped"
			}
			res[c.Package+": "+c.Class] = v
		}
	}
	return res
}

// h2specStreamStates are the cases of stream states (RFC 9113 §5.1,
// §5.1.1, §5.3.1, §8.1, §8.2.2) the lean listener must pass, whatever
// grpc-go does.
var h2specStreamStates = []string{
	"http2/5.1: half closed (remote): Sends a DATA frame",
	"http2/5.1: closed: Sends a DATA frame",
	"http2/5.1: closed: Sends a DATA frame after sending RST_STREAM frame",
	"http2/5.1: closed: Sends a HEADERS frame",
	`http2/6.1: Sends a DATA frame on the stream that is not in "open" or "half-closed (local)" state`,
	"http2/5.1.1: Sends stream identifier that is numerically smaller than previous",
	"http2/5.3.1: Sends HEADERS frame that depend on itself",
	"http2/5.3.1: Sends PRIORITY frame that depend on itself",
	"http2/8.1: Sends a second HEADERS frame without the END_STREAM flag",
	"http2/8.1.2.1: Sends a HEADERS frame that contains a pseudo-header field as trailers",
	"http2/8.1.2.2: Sends a HEADERS frame that contains the connection-specific header field",
	`http2/8.1.2.2: Sends a HEADERS frame that contains the TE header field with any value other than "trailers"`,
}

// TestH2spec runs the HTTP/2 conformance suite h2spec, with its requests
// made gRPC Checks (grpcShaper), against the lean listener and against
// grpc-go serving the same handler, the reference: the lean listener
// fails no case grpc-go passes, and passes every stream-state case.
func TestH2spec(t *testing.T) {
	bin := h2specBinary(t)
	svc := newAuthz(t)
	// The bounds the lean listener runs with here, as the gRPC port and
	// the lean listener share theirs.
	gs := grpc.NewServer(grpc.ForceServerCodecV2(checkgrpc.NewCodec()),
		grpc.MaxConcurrentStreams(checkh2.DefaultMaxConcurrentStreams),
		grpc.MaxRecvMsgSize(checkh2.DefaultMaxRecvMsgBytes),
		grpc.MaxHeaderListSize(checkh2.DefaultMaxHeaderListBytes))
	checkgrpc.Register(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	_, lean := serve(t, checkh2.Config{Check: svc})
	req := upload("h2spec")
	req.Attributes.Request.Http.Path = "/not/limited" // allowed, no bucket spent
	shaped := func(target string) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		p := &grpcShaper{target: target, msg: grpcMessage(t, req)}
		go p.serve(t, l)
		return l.Addr().String()
	}
	// Both at once: a failing case waits out h2spec's timeout.
	var ref, got map[string]string
	var wg sync.WaitGroup
	wg.Go(func() { ref = h2specRun(t, bin, shaped(lis.Addr().String())) })
	got = h2specRun(t, bin, shaped(lean))
	wg.Wait()
	if t.Failed() {
		return
	}
	if len(got) < 100 || len(got) != len(ref) {
		t.Fatalf("h2spec ran %d cases on the lean listener and %d on grpc-go, want the same, at least 100", len(got), len(ref))
	}
	count := map[[2]string]int{}
	for _, k := range slices.Sorted(maps.Keys(ref)) {
		count[[2]string{ref[k], got[k]}]++
		if ref[k] == "passed" && got[k] != "passed" {
			t.Errorf("%s: %s on the lean listener, passed on grpc-go", k, got[k])
		}
		if ref[k] != got[k] {
			t.Logf("grpc-go %-7s lean %-7s %s", ref[k], got[k], k)
		}
	}
	for _, k := range h2specStreamStates {
		if got[k] != "passed" {
			t.Errorf("%s: %q on the lean listener, want passed", k, got[k])
		}
	}
	t.Logf("h2spec cases by outcome (grpc-go, lean): %v", count)
}
