package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

var buckets = []admin.Bucket{
	{ID: 0, Name: "upload", Limit: 10, WindowMS: 1000, Algorithm: counter.Fixed, Protocol: "ext_authz"},
	{ID: 3, Name: "login_ip", Limit: 5, WindowMS: 60_000, Algorithm: counter.Sliding, Protocol: "ext_authz"},
}

// start runs an admin listener on a loopback port until the test ends.
func start(t *testing.T, cfg admin.Config, sk *top.Sketch, g prometheus.Gatherer) string {
	t.Helper()
	return startWith(t, cfg, admin.Deps{Sketch: sk, Gatherer: g})
}

// startWith is start with every dependency given; Buckets defaults to
// buckets.
func startWith(t *testing.T, cfg admin.Config, deps admin.Deps) string {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if deps.Buckets == nil {
		deps.Buckets = func() []admin.Bucket { return buckets }
	}
	s, err := admin.New(cfg, deps, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	return "http://" + s.Addr().String()
}

func get(t *testing.T, method, url, token string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// flood records a tenant over its budget among many others in upload.
func flood(t *testing.T, keys ...string) *top.Sketch {
	t.Helper()
	sk, err := top.New(top.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ms := now.UnixMilli()
	for i := range 2000 {
		sk.Hit(0, "tenant-"+string(rune('a'+i%26))+string(rune('a'+i/26%26)), 1, true, ms/1000, 1000, ms)
	}
	for _, k := range keys {
		for range 100 {
			sk.Hit(0, k, 1, false, ms/1000, 1000, ms)
		}
	}
	return sk
}

func TestUnsafeAddressRefused(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "example.com:0"} {
		_, err := admin.New(admin.Config{Addr: addr}, admin.Deps{}, slog.New(slog.DiscardHandler))
		if !errors.Is(err, admin.ErrUnsafe) {
			t.Errorf("New(%q) without a token: %v, want ErrUnsafe", addr, err)
		}
	}
	s, err := admin.New(admin.Config{Addr: "0.0.0.0:0", Token: "t"}, admin.Deps{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New on every interface with a token: %v", err)
	}
	s.Close()
	s.Close() // idempotent
}

func TestTokenRequired(t *testing.T) {
	url := start(t, admin.Config{Token: "s3cret"}, flood(t), nil)
	for _, tok := range []string{"", "wrong", "S3CRET", "s3cret2"} {
		for _, path := range []string{"/", "/v1/top", "/nothing"} {
			code, h, body := get(t, "GET", url+path, tok)
			if code != http.StatusUnauthorized || h.Get("WWW-Authenticate") == "" || strings.Contains(body, "tenant") {
				t.Errorf("GET %s with token %q: %d %q", path, tok, code, body)
			}
		}
	}
	if code, _, _ := get(t, "GET", url+"/v1/top", "s3cret"); code != http.StatusOK {
		t.Errorf("GET /v1/top with the token: %d", code)
	}
	// The scheme's name is case-insensitive (RFC 7235 §2.1); the token
	// is not, and another scheme is refused.
	for header, want := range map[string]int{
		"bearer s3cret": 200, "BEARER s3cret": 200, "Bearer  s3cret": 200,
		"Basic s3cret": 401, "Bearers3cret": 401, "bearer S3CRET": 401, "s3cret": 401,
	} {
		req, err := http.NewRequest("GET", url+"/v1/top", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", header)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Authorization %q: %d, want %d", header, resp.StatusCode, want)
		}
	}
}

func TestOnlyGetAndBoundedQueries(t *testing.T) {
	url := start(t, admin.Config{}, flood(t), nil)
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		if code, h, _ := get(t, m, url+"/v1/top", ""); code != http.StatusMethodNotAllowed || h.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /v1/top: %d, Allow %q", m, code, h.Get("Allow"))
		}
	}
	for q, want := range map[string]int{
		"?bucket=upload":                      200,
		"?n=100":                              200,
		"?n=0":                                400,
		"?n=101":                              400,
		"?n=x":                                400,
		"?nope=1":                             400,
		"?bucket=a&bucket=b":                  400,
		"?bucket=%zz":                         400,
		"?bucket=none":                        404,
		"?cluster=2":                          400,
		"?bucket=" + strings.Repeat("a", 600): 414,
	} {
		for _, path := range []string{"/v1/top", "/"} {
			if code, _, body := get(t, "GET", url+path+q, ""); code != want {
				t.Errorf("GET %s%s: %d %q, want %d", path, q, code, body, want)
			}
		}
	}
	if code, _, _ := get(t, "GET", url+"/v1/topx", ""); code != http.StatusNotFound {
		t.Errorf("GET /v1/topx: %d", code)
	}
}

func TestTopJSON(t *testing.T) {
	url := start(t, admin.Config{}, flood(t, "noisy", "quieter"), nil)
	code, h, body := get(t, "GET", url+"/v1/top?bucket=upload&n=3", "")
	if code != 200 || h.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/top: %d %s", code, h.Get("Content-Type"))
	}
	var resp admin.TopResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Buckets) != 1 {
		t.Fatalf("buckets %+v", resp.Buckets)
	}
	b := resp.Buckets[0]
	if b.Bucket != "upload" || b.Limit != 10 || b.WindowMS != 1000 || b.Algorithm != "fixed" || b.Protocol != "ext_authz" {
		t.Errorf("bucket %+v", b)
	}
	if d := b.Minute.TopDenied; len(d) != 2 || d[0].Key != "noisy" || d[0].Hits != 100 || b.Minute.Denied != 200 {
		t.Errorf("minute's top denied %+v (denied %d)", d, b.Minute.Denied)
	}
	// 2,000 admitted over 676 keys of about 3 hits each: every entry the
	// sketch kept is more error than count, so none is listed.
	if len(b.Minute.TopAdmitted) != 0 || b.Minute.Admitted != 2000 {
		t.Errorf("minute's top admitted %+v (admitted %d), want none listed of 2000", b.Minute.TopAdmitted, b.Minute.Admitted)
	}
	if b.Window == nil || len(b.Window.TopDenied) != 2 || len(b.Epochs) != top.Epochs {
		t.Errorf("window %+v, epochs %v", b.Window, b.Epochs)
	}
	for _, field := range []string{`"minute"`, `"top_denied"`, `"unlisted_denied"`, `"epochs"`, `"window_ms"`, `"epoch_ms"`} {
		if !strings.Contains(body, field) {
			t.Errorf("body has no %s: %s", field, body)
		}
	}
	code, _, body = get(t, "GET", url+"/v1/top", "")
	if err := json.Unmarshal([]byte(body), &resp); code != 200 || err != nil || len(resp.Buckets) != 2 {
		t.Errorf("GET /v1/top: %d %v %d buckets", code, err, len(resp.Buckets))
	}
}

// A key that spends a budget stays listed in a flood of one-shot keys,
// and none of the one-shot keys is: each would be mostly error.
func TestTopLeavesOutNoise(t *testing.T) {
	sk, err := top.New(top.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ms := time.Now().UnixMilli()
	for i := range 3000 {
		sk.Hit(0, fmt.Sprint("one-", i), 1, true, ms/1000, 1000, ms)
		if i%10 == 0 {
			sk.Hit(0, "steady", 1, true, ms/1000, 1000, ms)
		}
	}
	url := start(t, admin.Config{}, sk, nil)
	_, _, body := get(t, "GET", url+"/v1/top?bucket=upload&n=10", "")
	var resp admin.TopResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil || len(resp.Buckets) != 1 {
		t.Fatalf("%v %s", err, body)
	}
	l := resp.Buckets[0].Minute.TopAdmitted
	if len(l) != 1 || l[0].Key != "steady" || l[0].Hits-l[0].Error > 300 {
		t.Errorf("top admitted %+v, want steady alone (300 hits)", l)
	}
}

func TestHideKeys(t *testing.T) {
	url := start(t, admin.Config{HideKeys: true}, flood(t, "203.0.113.7"), nil)
	var hashes []string
	for _, path := range []string{"/v1/top?bucket=upload", "/v1/top?bucket=upload", "/"} {
		code, _, body := get(t, "GET", url+path, "")
		if code != 200 || strings.Contains(body, "203.0.113.7") || strings.Contains(body, "tenant-") {
			t.Fatalf("GET %s: %d, shows a key: %s", path, code, body)
		}
		if path == "/" {
			if !strings.Contains(body, hashes[0]) {
				t.Errorf("the page does not show the hash %s", hashes[0])
			}
			continue
		}
		var resp admin.TopResponse
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, resp.Buckets[0].Minute.TopDenied[0].Key)
	}
	if !strings.HasPrefix(hashes[0], "hmac:") || hashes[0] != hashes[1] {
		t.Errorf("hashes %q: want one stable keyed hash", hashes)
	}
}

func TestPage(t *testing.T) {
	reg := prometheus.NewRegistry()
	peers := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ratelimit_authz_replicate_peers", Help: "h"})
	peers.Set(2)
	reg.MustRegister(peers)
	hostile := `<script>alert(1)</script>"'&`
	url := start(t, admin.Config{Refresh: 3 * time.Second}, flood(t, hostile, "noisy\x00\xff"), reg)
	code, h, body := get(t, "GET", url+"/", "")
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", code, h.Get("Content-Type"))
	}
	if strings.Contains(body, "<script") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the hostile key is not escaped:\n%s", body)
	}
	if !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'none'") || h.Get("X-Frame-Options") != "DENY" {
		t.Errorf("headers %v", h)
	}
	for _, want := range []string{`<meta http-equiv="refresh" content="3">`, `id="b-upload"`, "replicate_peers", ">2<", "login_ip", "1s", "1m", "sliding"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	for _, unwanted := range []string{"1m0s", "e+0"} {
		if strings.Contains(body, unwanted) {
			t.Errorf("the page writes %q", unwanted)
		}
	}
	if code, _, body := get(t, "HEAD", url+"/", ""); code != 200 || body != "" {
		t.Errorf("HEAD /: %d %q", code, body)
	}
}

// state is a node's configuration and overrides, as given.
type state struct {
	config    admin.ConfigState
	overrides admin.OverridesState
}

func (s state) Config() admin.ConfigState       { return s.config }
func (s state) Overrides() admin.OverridesState { return s.overrides }

// The page shows the configuration's generation, the last reload's
// refusal with each of its problems escaped, and where the overrides
// come from.
func TestPageConfigAndOverrides(t *testing.T) {
	now := time.Now()
	st := state{
		config: admin.ConfigState{Generation: 7, Applied: now.Add(-time.Hour), Last: &admin.Reload{
			At: now.Add(-time.Minute), Err: "2 problems",
			Problems: []string{"a.yaml:2:3: bucket <b>x</b>", "a.yaml:9:1: unknown key"},
		}},
		overrides: admin.OverridesState{Source: "snapshot", Detail: "snapshot file /var/lib/o.json (3 overrides, 0 key owners)"},
	}
	url := startWith(t, admin.Config{}, admin.Deps{Sketch: flood(t), State: st})
	code, _, body := get(t, "GET", url+"/", "")
	if code != 200 {
		t.Fatalf("GET /: %d", code)
	}
	for _, want := range []string{`<strong id="generation">7</strong>`, "was <strong>refused</strong>",
		"<code>a.yaml:2:3: bucket &lt;b&gt;x&lt;/b&gt;</code>", "<code>a.yaml:9:1: unknown key</code>",
		`<strong id="overrides-source">snapshot</strong>`, "(3 overrides, 0 key owners)"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page has no %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "<b>x") {
		t.Errorf("a problem is not escaped:\n%s", body)
	}
	st.config.Last = &admin.Reload{At: now, Err: "node: reload refused: counter.max_keys only changes with a restart"}
	_, _, body = get(t, "GET", startWith(t, admin.Config{}, admin.Deps{Sketch: flood(t), State: st})+"/", "")
	if !strings.Contains(body, `<p id="reload-problems"><code>node: reload refused: counter.max_keys only changes with a restart</code></p>`) {
		t.Errorf("a refusal without located problems is not shown:\n%s", body)
	}
}

// The page lists a cluster node's peers, escaping their node ids, with
// their delivery delay, clock skew and probes' round trip, and says
// whether messages are sealed; a node alone says so.
func TestPageCluster(t *testing.T) {
	heard := time.Now().Add(-1500 * time.Millisecond)
	url := startWith(t, admin.Config{}, admin.Deps{Sketch: flood(t), Cluster: func() admin.Cluster {
		return admin.Cluster{Self: "n1/00000000000000ab", Peers: []admin.Peer{
			{Node: "<i>n2</i>", Incarnation: 0xcd, LastHeard: heard, DelayMS: 12, SkewMS: -3, RoundTripMS: 17},
			{Node: "n3", Incarnation: 1, RoundTripMS: -1},
		}}
	}})
	_, _, body := get(t, "GET", url+"/", "")
	for _, want := range []string{"n1/00000000000000ab", "not sealed", "&lt;i&gt;n2&lt;/i&gt;", "00000000000000cd", "12 ms", "-3 ms", "17 ms", "no probe echoed", "never", "2 peer(s)"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if strings.Contains(body, "<i>n2") {
		t.Errorf("a peer's node id is not escaped")
	}
	url = start(t, admin.Config{}, flood(t), nil)
	if _, _, body := get(t, "GET", url+"/", ""); !strings.Contains(body, "Not in a cluster") {
		t.Errorf("a node alone does not say so")
	}
}

// ?cluster=1 merges the peers' answers (made by their Answer) into this
// node's tops, names a peer whose answer does not decode and those that
// did not answer, and is refused on a node outside a cluster.
func TestClusterQuery(t *testing.T) {
	peer, err := admin.New(admin.Config{Addr: "127.0.0.1:0"}, admin.Deps{Buckets: func() []admin.Bucket { return buckets }, Sketch: flood(t, "noisy")}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	var asked []byte
	url := startWith(t, admin.Config{HideKeys: true}, admin.Deps{Sketch: flood(t, "noisy", "local-only"),
		Cluster: func() admin.Cluster { return admin.Cluster{Self: "a/01"} },
		Ask: func(ctx context.Context, q []byte) ([]admin.PeerAnswer, []string, error) {
			asked = q
			return []admin.PeerAnswer{{Peer: "b/02", Body: peer.Answer(q)}, {Peer: "c/03", Body: []byte("{not json")}}, []string{"d/04"}, nil
		}})
	code, _, body := get(t, "GET", url+"/v1/top?cluster=1&bucket=upload&n=2", "")
	if code != 200 {
		t.Fatalf("GET ?cluster=1: %d %s", code, body)
	}
	var resp admin.TopResponse
	if err := json.Unmarshal([]byte(body), &resp); err != nil {
		t.Fatal(err)
	}
	if string(asked) != `{"bucket":"upload"}` {
		t.Errorf("asked %s", asked)
	}
	if fmt.Sprint(resp.Nodes) != "[a/01 b/02]" || fmt.Sprint(resp.Missing) != "[d/04 c/03]" {
		t.Errorf("nodes %v, missing %v", resp.Nodes, resp.Missing)
	}
	m := resp.Buckets[0].Minute
	if m.Admitted != 4000 || m.Denied != 300 || len(m.TopDenied) != 2 || m.TopDenied[0].Hits != 200 || !strings.HasPrefix(m.TopDenied[0].Key, "hmac:") {
		t.Errorf("merged minute: %d admitted, %d denied, top denied %+v", m.Admitted, m.Denied, m.TopDenied)
	}
	if strings.Contains(body, "noisy") {
		t.Errorf("a merged key is not hidden: %s", body)
	}
	if _, _, page := get(t, "GET", url+"/?cluster=1", ""); !strings.Contains(page, "no answer from <code>d/04</code>, <code>c/03</code>") {
		t.Errorf("the page does not name the peers that did not answer:\n%s", page)
	}
	plain := start(t, admin.Config{}, flood(t), nil)
	if code, _, _ := get(t, "GET", plain+"/v1/top?cluster=1", ""); code != http.StatusBadRequest {
		t.Errorf("?cluster=1 outside a cluster: %d", code)
	}
	if got := peer.Answer([]byte("{")); got != nil {
		t.Errorf("Answer of a malformed query: %s", got)
	}
}
