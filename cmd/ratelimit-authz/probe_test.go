package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// runProbeCmd runs `probe args…` with vars as its environment and returns
// its exit status, stdout and the one-line reason main prints on stderr.
func runProbeCmd(t *testing.T, vars map[string]string, args ...string) (code int, stdout, reason string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, append([]string{"probe"}, args...), env(vars), &out, &errOut)
	if err == nil {
		return 0, out.String(), ""
	}
	ee, ok := err.(exitError)
	if !ok {
		t.Fatalf("probe %q: %v, not an exit status", args, err)
	}
	if strings.ContainsAny(ee.msg, "\r\n\x1b") {
		t.Errorf("probe %q: the reason is not one clean line: %q", args, ee.msg)
	}
	return ee.code, out.String(), ee.msg
}

// readyGauge is ratelimit_authz_ready as the node's /metrics serves it.
func readyGauge(t *testing.T, n *servedNode) float64 {
	t.Helper()
	m, err := scrape.Get(&http.Client{Timeout: 5 * time.Second}, "http://"+n.http+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	v, ok := m.Get("ratelimit_authz_ready")
	if !ok {
		t.Fatal("/metrics has no ratelimit_authz_ready")
	}
	return v
}

// A real cluster node through its life: held back by a warm start that a
// silent peer never completes, ready, then draining. The probe and the
// ready gauge follow /readyz at each stage.
func TestProbeRealNode(t *testing.T) {
	natsURL := silentPeer(t)
	n := startNode(t, "probed", writeConfig(t, clusterTestConfig), natsURL, map[string]string{
		"RATELIMIT_AUTHZ_WARM_START_TIMEOUT": "3s",
		"RATELIMIT_AUTHZ_DRAIN_DELAY":        "3s",
	})
	url := "http://" + n.http + "/readyz"

	// Warming up.
	if code, _, reason := runProbeCmd(t, nil, "--url", url); code != 1 || !strings.Contains(reason, "503") || !strings.Contains(reason, `"not ready"`) {
		t.Errorf("during the warm start: exit %d %q, want 1 and the 503", code, reason)
	}
	if v := readyGauge(t, n); v != 0 {
		t.Errorf("ready %v during the warm start, want 0", v)
	}

	// Ready; the URL may also come from the environment.
	n.waitReady(t)
	if code, out, reason := runProbeCmd(t, nil, "--url", url); code != 0 || !strings.Contains(out, "200 OK") {
		t.Errorf("ready: exit %d %q %q, want 0", code, out, reason)
	}
	if code, _, reason := runProbeCmd(t, map[string]string{"RATELIMIT_AUTHZ_PROBE_URL": url}); code != 0 {
		t.Errorf("URL from RATELIMIT_AUTHZ_PROBE_URL: exit %d %q", code, reason)
	}
	if v := readyGauge(t, n); v != 1 {
		t.Errorf("ready %v once /readyz answers 200, want 1", v)
	}

	// Draining: /readyz turns 503 at once, the metrics are still served.
	stopped := make(chan error, 1)
	go func() { stopped <- n.stop() }()
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if c := n.readyz(t); c != http.StatusServiceUnavailable {
			return fmt.Errorf("readyz %d", c)
		}
		return nil
	})
	if code, _, reason := runProbeCmd(t, nil, "--url", url); code != 1 || !strings.Contains(reason, "503") {
		t.Errorf("draining: exit %d %q, want 1 and the 503", code, reason)
	}
	if v := readyGauge(t, n); v != 0 {
		t.Errorf("ready %v while draining, want 0", v)
	}
	if err := <-stopped; err != nil {
		t.Errorf("serve: %v", err)
	}
	// Stopped: nothing listens any more.
	if code, _, reason := runProbeCmd(t, nil, "--url", url); code != 1 || !strings.Contains(reason, "connection refused") {
		t.Errorf("stopped: exit %d %q, want 1, connection refused", code, reason)
	}
}

// Usage errors and bad URLs exit 1 (never Docker's reserved 2) with a reason
// and send nothing.
func TestProbeRefuses(t *testing.T) {
	var hits atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer ts.Close()
	host := strings.TrimPrefix(ts.URL, "http://")
	for _, c := range []struct {
		args []string
		vars map[string]string
		want string
	}{
		{[]string{"--url", "ftp://" + host + "/readyz"}, nil, "the scheme must be http or https"},
		{[]string{"--url", "file:///etc/passwd"}, nil, "the scheme must be http or https"},
		{[]string{"--url", "unix:///run/ratelimit.sock"}, nil, "the scheme must be http or https"},
		{[]string{"--url", "javascript:alert(1)"}, nil, "the scheme must be http or https"},
		{[]string{"--url", host + "/readyz"}, nil, "URL"}, // no scheme
		{[]string{"--url", "http:///readyz"}, nil, "no host"},
		{[]string{"--url", "http://:9090/readyz"}, nil, "no host"},
		{[]string{"--url", "http://[::1/readyz"}, nil, "URL"},
		{[]string{"--url", "http://" + host + "/\x7f\n"}, nil, "URL"},
		{[]string{"--url", ts.URL, "--timeout", "0s"}, nil, "timeout 0s"},
		{[]string{"--url", ts.URL, "--timeout", "-1s"}, nil, "timeout -1s"},
		{[]string{"--url", ts.URL, "--timeout", "2m"}, nil, "at most 1m0s"},
		{[]string{"--url", ts.URL}, map[string]string{"RATELIMIT_AUTHZ_PROBE_TIMEOUT": "soon"}, "RATELIMIT_AUTHZ_PROBE_TIMEOUT"},
		{[]string{"--bogus"}, nil, ""},
		{[]string{"--url", ts.URL, "extra"}, nil, ""},
	} {
		code, _, reason := runProbeCmd(t, c.vars, c.args...)
		if code != 1 || !strings.Contains(reason, c.want) {
			t.Errorf("probe %q: exit %d %q, want 1 with %q", c.args, code, reason, c.want)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests sent by refused probes", n)
	}
	if code, out, _ := runProbeCmd(t, nil, "--help"); code != 0 || !strings.Contains(out, "RATELIMIT_AUTHZ_PROBE_URL") || !strings.Contains(out, defaultProbeURL) {
		t.Errorf("--help: exit %d\n%s", code, out)
	}
	// A password in the URL never reaches the reason.
	if _, _, reason := runProbeCmd(t, nil, "--url", "http://u:hunter2@127.0.0.1:1/readyz"); strings.Contains(reason, "hunter2") {
		t.Errorf("the reason shows the password: %q", reason)
	}
}

// What the far end can do to a probe: refuse, never answer, redirect
// elsewhere, answer with a huge or hostile body, stall mid-body, or
// present a certificate nobody trusts. Each is a failure with its reason,
// the redirect is not followed, and no more than a small body is read.
func TestProbeHostileEnds(t *testing.T) {
	// A refused port.
	port := freeport.TestPort(t)
	if code, _, reason := runProbeCmd(t, nil, "--url", fmt.Sprintf("http://127.0.0.1:%d/readyz", port)); code != 1 || !strings.Contains(reason, "connection refused") {
		t.Errorf("refused port: exit %d %q", code, reason)
	}

	// A listener that accepts and never answers.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open until the listener closes
		}
	}()
	if code, _, reason := runProbeCmd(t, nil, "--url", "http://"+lis.Addr().String()+"/readyz", "--timeout", "300ms"); code != 1 || !strings.Contains(reason, "no answer within 300ms") {
		t.Errorf("silent listener: exit %d %q", code, reason)
	}

	// A redirect to another host is reported, not followed; so is one to
	// the same host.
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/readyz", http.StatusFound)
	})
	mux.HandleFunc("/here", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusMovedPermanently) })
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ready") })
	mux.HandleFunc("/huge", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		for range 1 << 10 { // 1 MiB without a line end
			w.Write(bytes.Repeat([]byte("x"), 1<<10))
		}
	})
	mux.HandleFunc("/endless", func(w http.ResponseWriter, r *http.Request) {
		for r.Context().Err() == nil { // until the probe hangs up
			if _, err := w.Write(bytes.Repeat([]byte("ready\n"), 1<<10)); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/hostile", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, "\x1b[32mready\x1b[0m\rall good\n200 OK")
	})
	mux.HandleFunc("/stall", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "ready")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ts := httptest.NewServer(mux)
	defer ts.Close()
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/away", 1, `302 Found (a redirect to "` + other.URL + `/readyz", not followed)`},
		{"/here", 1, "301 Moved Permanently"},
		{"/ok", 0, ""},
		{"/huge", 1, "503 Service Unavailable"},
		{"/endless", 0, ""},
		{"/hostile", 1, `\x1b[32mready`},
		{"/stall", 1, "200 OK, then reading the body"},
	} {
		code, _, reason := runProbeCmd(t, nil, "--url", ts.URL+c.path, "--timeout", "1s")
		if code != c.code || !strings.Contains(reason, c.want) {
			t.Errorf("%s: exit %d %q, want %d with %q", c.path, code, reason, c.code, c.want)
		}
		if len(reason) > 2*maxProbeReason+len(ts.URL)+200 {
			t.Errorf("%s: a reason of %d bytes", c.path, len(reason))
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the redirect to another host was followed (%d requests)", n)
	}

	// https: a certificate of no trusted CA fails.
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ready") }))
	defer tlsSrv.Close()
	if code, _, reason := runProbeCmd(t, nil, "--url", tlsSrv.URL+"/readyz"); code != 1 || !strings.Contains(reason, "certificate") {
		t.Errorf("untrusted certificate: exit %d %q", code, reason)
	}
}

// FuzzProbeTarget: whatever the URL, the probe either refuses it or has an
// http(s) URL with a host to dial.
func FuzzProbeTarget(f *testing.F) {
	for _, s := range []string{defaultProbeURL, "https://[::1]:9090/readyz", "ftp://x", "file:///etc/passwd", "http://", "http://:1", "//host/x", "http://u:p@h/", "\x00", "http://%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := probeTarget(raw, time.Second)
		if err != nil {
			return
		}
		if u.Scheme != "http" && u.Scheme != "https" || u.Hostname() == "" {
			t.Fatalf("%q accepted as %#v", raw, u)
		}
	})
}

// FuzzDescribe: whatever the far end answers, the reason is one line of
// bounded length.
func FuzzDescribe(f *testing.F) {
	f.Add("503 Service Unavailable", 503, "", []byte("not ready\noverrides: none\n"))
	f.Add("302 Found", 302, "http://evil.example/\r\nX: y", []byte{})
	f.Add("200 \x1b[2Jok", 200, "", []byte("\x1b[31mready\r"+strings.Repeat("x", 5000)))
	f.Fuzz(func(t *testing.T, status string, code int, location string, body []byte) {
		line := describe(status, code, location, body)
		if strings.ContainsAny(line, "\r\n\x1b") {
			t.Fatalf("not one clean line: %q", line)
		}
		if len(line) > 3*4*(maxProbeReason+4)+64 { // three clipped parts, each escaped at most 4×
			t.Fatalf("%d bytes", len(line))
		}
	})
}
