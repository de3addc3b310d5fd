package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/proc"
)

func TestHelpAndUsage(t *testing.T) {
	ctx := context.Background()
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"--help"}, nil, &out, &errOut); err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"Usage: ratelimit-demo", "-server-bin", "-envoy", "-config", "-envoy-config", "-keep-logs", "-timeout"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
	for _, args := range [][]string{{"--no-such-flag"}, {"extra"}, {"--timeout", "0s"}} {
		out.Reset()
		errOut.Reset()
		err := run(ctx, args, nil, &out, &errOut)
		if code := exitCode(err, &errOut); code != 2 {
			t.Errorf("%q: exit %d (%v), want 2", args, code, err)
		}
		if errOut.Len() == 0 {
			t.Errorf("%q: nothing on stderr", args)
		}
	}
}

func TestExitCode(t *testing.T) {
	var errOut bytes.Buffer
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{usageError{errors.New("bad")}, 2},
		{errInterrupted, 130},
		{errors.New("boom"), 1},
	} {
		if got := exitCode(tc.err, &errOut); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestMissingFiles(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--config", filepath.Join(dir, "missing.yaml")},
		{"--envoy-config", filepath.Join(dir, "missing.yaml")},
		{"--envoy", filepath.Join(dir, "envoy")},
		{"--server-bin", dir},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append(args, "--log-dir", dir), nil, &out, &errOut)
		if err == nil || exitCode(err, &errOut) != 1 {
			t.Errorf("%q: %v, want an error with exit 1", args, err)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("log folders left behind: %v", entries)
	}
}

func TestChildEnv(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "RATELIMIT_AUTHZ_NATS_URL=nats://x", "RATE_LIMIT_BACKEND=cluster", "HOME=/root"})
	if strings.Join(got, " ") != "PATH=/bin HOME=/root" {
		t.Errorf("childEnv = %q", got)
	}
}

func TestInterleave(t *testing.T) {
	rows := []*row{{n: 600}, {n: 50}}
	got := interleave(rows)
	if len(got) != 650 {
		t.Fatalf("%d jobs, want 650", len(got))
	}
	// The small row is spread over the whole burst: one in each twelfth.
	for part := range 10 {
		n := 0
		for _, i := range got[part*65 : (part+1)*65] {
			if i == 1 {
				n++
			}
		}
		if n < 4 || n > 6 {
			t.Errorf("part %d holds %d of the small row, want about 5", part, n)
		}
	}
}

func TestWindowEnd(t *testing.T) {
	at := time.UnixMilli(1_700_000_123_456)
	if got := windowEnd(at, time.Second); got.UnixMilli() != 1_700_000_124_000 {
		t.Errorf("second: %d", got.UnixMilli())
	}
	if got := windowEnd(at, time.Minute); got.UnixMilli() != 1_700_000_160_000 {
		t.Errorf("minute: %d", got.UnixMilli())
	}
	if got := windowEnd(time.UnixMilli(1_700_000_124_000), time.Second); got.UnixMilli() != 1_700_000_125_000 {
		t.Errorf("on a boundary: %d", got.UnixMilli())
	}
}

func TestPrinter(t *testing.T) {
	var plain bytes.Buffer
	p := newPrinter(&plain, false)
	p.progress("1/10")
	p.progress("5/10")
	p.progressDone("10/10")
	p.linef("table")
	if got := plain.String(); got != "10/10\ntable\n" {
		t.Errorf("off a terminal: %q", got)
	}

	var term bytes.Buffer
	p = newPrinter(&term, true)
	p.progress("1/10 long")
	p.progress("5/10")
	p.progressDone("10/10")
	p.progress("x")
	p.linef("table")
	if got, want := term.String(), "\r1/10 long\r5/10     \r10/10\n\rx\r \rtable\n"; got != want {
		t.Errorf("on a terminal: %q, want %q", got, want)
	}

	stop := p.redraw(func() string { return "tick" })
	stop()
	if !strings.Contains(term.String(), "tick") {
		t.Error("redraw drew nothing")
	}
}

func answer(status int, header ...string) result {
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return result{status: status, header: h, body: []byte(`{}`)}
}

func TestRowAndCheck(t *testing.T) {
	r := &row{bucket: "activity_create", what: "POST /api/activities", n: 5, want429: true}
	for range 3 {
		r.record(answer(200, "RateLimit-Policy", `"activity_create";q=3;w=1`))
	}
	r.record(answer(429, "Retry-After", "2", "RateLimit-Policy", `"activity_create";q=3;w=1`))
	r.record(answer(429, "Retry-After", "1"))
	r.upstream = 3
	if r.sent != 5 || r.ok != 3 || r.denied != 2 || r.retryMin != 1 || r.retryMax != 2 || r.sample == nil {
		t.Fatalf("row %+v", r)
	}
	if r.policy != `"activity_create";q=3;w=1` {
		t.Errorf("policy %q", r.policy)
	}
	if err := check([]*row{r}); err != nil {
		t.Errorf("check: %v", err)
	}

	quiet := &row{bucket: "inbound", what: "quiet", n: 2}
	quiet.record(answer(200))
	quiet.record(answer(429))
	quiet.upstream = 1
	broken := &row{bucket: "upload", what: "uploads", n: 3, want429: true}
	broken.record(answer(503))
	broken.record(result{err: errors.New("connection refused")})
	broken.record(answer(200))
	broken.upstream = 2 // one more than passed
	err := check([]*row{r, quiet, broken})
	if err == nil {
		t.Fatal("check passed")
	}
	for _, want := range []string{"1 × 429; the shipped limits should admit all", "1 requests failed", "connection refused", "1 answers 503", "status_on_error", "no 429 in 3 requests", "the app saw 2 requests, want 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("check error lacks %q:\n%v", want, err)
		}
	}
	if got := broken.otherText(); got != "1 × 503, 1 × error" {
		t.Errorf("otherText = %q", got)
	}

	var out bytes.Buffer
	report(newPrinter(&out, false), []*row{r, quiet, broken})
	for _, want := range []string{"bucket", "RateLimit-Policy", "1-2 s", `"activity_create";q=3;w=1`, "A 429 as the client saw it (activity_create)", "retry-after: 2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// demoCommand builds this command and returns it with the arguments that
// point it at the server and Envoy to run. Like the end-to-end tests, it
// needs Envoy and a buildable server (or $E2E_ENVOY_BIN and
// $E2E_SERVER_BIN): without them the test is skipped, and failed under
// CI=true. The command is built without the race detector, so the bursts
// run at the speed a user sees.
func demoCommand(t *testing.T) (bin string, args []string) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Envoy and a server; -short")
	}
	unavailable := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format+" (skipped; fails under CI=true)", args...)
	}
	root, err := binaries.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	envoyBin := os.Getenv("E2E_ENVOY_BIN")
	if envoyBin == "" {
		if envoyBin, err = binaries.Envoy(ctx, root); err != nil {
			unavailable("envoy not available: %v", err)
		}
	}
	dir := t.TempDir()
	serverBin := os.Getenv("E2E_SERVER_BIN")
	if serverBin == "" {
		serverBin = filepath.Join(dir, "ratelimit-authz")
		if err := binaries.BuildServer(ctx, root, serverBin); err != nil {
			unavailable("%v", err)
		}
	}
	bin = filepath.Join(dir, "ratelimit-demo")
	if err := binaries.Build(ctx, root, "./cmd/ratelimit-demo", bin); err != nil {
		t.Fatal(err)
	}
	return bin, []string{"--envoy", envoyBin, "--server-bin", serverBin, "--log-dir", t.TempDir()}
}

// startDemo starts the built command, its output in a log of the test.
func startDemo(t *testing.T, extra ...string) *proc.Process {
	t.Helper()
	bin, args := demoCommand(t)
	p, err := proc.Start(context.Background(), proc.Config{
		Name: "ratelimit-demo", Path: bin, Args: append(args, extra...), LogDir: t.TempDir(),
		Lifetime: 3 * time.Minute, StopGrace: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	return p
}

func waitExit(t *testing.T, p *proc.Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(3 * time.Minute):
		t.Fatalf("the demo still runs after 3 minutes:\n%s", p.Tail(40))
	}
}

// pids returns the process ids the demo's output announces.
func pids(t *testing.T, log string) []int {
	t.Helper()
	var out []int
	for _, m := range regexp.MustCompile(`(?m)^  (?:ratelimit-authz|envoy) +pid (\d+)`).FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	if len(out) != 2 {
		t.Fatalf("want the pids of ratelimit-authz and envoy in the output:\n%s", log)
	}
	return out
}

func checkGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists (kill -0: %v)", pid, err)
		}
	}
}

// TestDemo runs the whole demo: exit 0, a row per bucket, everything
// stopped, the log folder removed.
func TestDemo(t *testing.T) {
	p := startDemo(t)
	waitExit(t, p)
	log := p.Tail(200)
	t.Logf("output:\n%s", log)
	if err := p.Err(); err != nil {
		t.Fatalf("demo: %v", err)
	}
	for _, want := range []string{
		"activity_create   POST /api/activities", "upload ", "inbound ", "token_generate ", "token_create ", "login_ip/account ",
		"A 429 as the client saw it", "stopped envoy",
		"who was limited (the live view", "and in `ratelimit-authz top`",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	checkGone(t, pids(t, log))
	if strings.Contains(log, "process logs kept") {
		t.Error("log folder kept after a successful run")
	}
}

// TestDemoInterrupt: Ctrl-C (SIGINT) in the middle of the bursts stops
// Envoy and the server by PID and exits 130, keeping the logs.
func TestDemoInterrupt(t *testing.T) {
	p := startDemo(t)
	poll.Until(t, 2*time.Minute, 20*time.Millisecond, func() error {
		if strings.Contains(p.Tail(50), "bursts through Envoy") {
			return nil
		}
		if p.Exited() {
			t.Fatalf("the demo exited before its bursts:\n%s", p.Tail(40))
		}
		return fmt.Errorf("the demo did not reach its bursts:\n%s", p.Tail(40))
	})
	if err := syscall.Kill(p.PID(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitExit(t, p)
	log := p.Tail(200)
	t.Logf("output:\n%s", log)
	var ee interface{ ExitCode() int }
	if !errors.As(p.Err(), &ee) || ee.ExitCode() != 130 {
		t.Errorf("exit: %v, want status 130", p.Err())
	}
	for _, want := range []string{"stopped envoy", "interrupted", "process logs kept in"} {
		if !strings.Contains(log, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	checkGone(t, pids(t, log))
}

// TestDemoStay: with --stay the stack stays up after the bursts and the
// demo prints what to try; the printed curl works through Envoy, the
// live view answers, and Ctrl-C then stops everything and exits 0.
func TestDemoStay(t *testing.T) {
	p := startDemo(t, "--stay")
	poll.Until(t, 2*time.Minute, 50*time.Millisecond, func() error {
		if strings.Contains(p.Tail(60), "The stack stays up until Ctrl-C") {
			return nil
		}
		if p.Exited() {
			t.Fatalf("the demo exited:\n%s", p.Tail(60))
		}
		return fmt.Errorf("not up yet:\n%s", p.Tail(20))
	})
	log := p.Tail(200)
	listener := regexp.MustCompile(`-H 'x-tenant-id: acme' http://(\S+)/api/activities `).FindStringSubmatch(log)
	live := regexp.MustCompile(`open http://(\S+)/ `).FindStringSubmatch(log)
	if listener == nil || live == nil {
		t.Fatalf("no curl or live view line:\n%s", log)
	}
	req, _ := http.NewRequest("POST", "http://"+listener[1]+"/api/activities", strings.NewReader("{}"))
	req.Header.Set("x-tenant-id", "stay-test")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") == "" {
		t.Fatalf("the printed curl: %v %v", resp, err)
	}
	resp.Body.Close()
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + live[1] + "/v1/top"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the live view: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := syscall.Kill(p.PID(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitExit(t, p)
	if err := p.Err(); err != nil {
		t.Errorf("exit after Ctrl-C with --stay: %v, want 0\n%s", err, p.Tail(40))
	}
	checkGone(t, pids(t, p.Tail(200)))
}
