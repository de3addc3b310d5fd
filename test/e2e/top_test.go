package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// TestTopThroughEnvoy: one tenant floods activities through Envoy among
// ten thousand tenants sending one each; the server's admin listener
// names it first in activity_create's denied top, in /v1/top and on the
// status page, with the 429s Envoy answered it, and the sketch's memory
// does not grow.
func TestTopThroughEnvoy(t *testing.T) {
	serverBin := serverBinary(t)
	config := serverConfigPath(t)
	s := prepareStack(t, 1)
	s.startEnvoy()
	adminAddr := s.spare[0]
	s.startServer(serverBin, config, "--admin-addr", adminAddr)

	var denied atomic.Int64
	start := time.Now()
	firstAt := make(chan time.Duration, 1)
	go func() { // how long after the flood starts it is first in the top
		for time.Since(start) < 30*time.Second {
			if r, err := readTop(s.client, adminAddr); err == nil && firstDenied(r) == "noisy" {
				firstAt <- time.Since(start)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		close(firstAt)
	}()
	denied.Store(flood(t, s, s.httpAddr))
	took := time.Since(start)
	if d, ok := <-firstAt; ok {
		t.Logf("%d requests in %v (noisy at %.0f/s against a budget of %d/s); noisy first in the denied top %v after the flood began",
			2*calmKeys, took, calmKeys/took.Seconds(), activityLimit, d)
	} else {
		t.Errorf("noisy never came first in the denied top")
	}

	var top admin.TopResponse
	poll.Until(t, 10*time.Second, 100*time.Millisecond, func() error {
		var err error
		if top, err = readTop(s.client, adminAddr); err != nil {
			return err
		}
		if firstDenied(top) != "noisy" {
			return fmt.Errorf("denied top %+v", top.Buckets)
		}
		return nil
	})
	k := top.Buckets[0].Minute.TopDenied[0]
	if got := uint64(denied.Load()); got == 0 || got < k.Hits-k.Error || got > k.Hits {
		t.Errorf("noisy listed with %d denied hits (error %d); Envoy answered it %d 429s", k.Hits, k.Error, got)
	}
	resp, err := s.client.Get("http://" + adminAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /: %d %v", resp.StatusCode, err)
	}
	first := strings.Index(string(page), `class="key denied"`)
	if first < 0 || !strings.HasPrefix(string(page[first:]), `class="key denied">noisy<`) {
		t.Errorf("the status page's first denied key is not noisy:\n%s", page)
	}

	t.Run("browser", func(t *testing.T) {
		// The page as a real headless browser renders it: noisy first in
		// its bucket's denied keys, the bucket's denied rate that of its
		// 429s over the minute (60 to 70 s: every denial was noisy's),
		// the configuration's generation and the overrides' source.
		dom := browserDOM(t, s.logs.dir, "http://"+adminAddr+"/")
		first := strings.Index(dom, `class="key denied"`)
		if first < 0 || !strings.HasPrefix(dom[first:], `class="key denied">noisy<`) {
			t.Errorf("the rendered page's first denied key is not noisy:\n%s", dom)
		}
		// The configuration it started with, never reloaded, and no
		// database: the configured limits only.
		for _, want := range []string{`<strong id="generation">1</strong>`, `<span id="last-reload">No reload since start.</span>`, `<strong id="overrides-source">off</strong>`} {
			if !strings.Contains(dom, want) {
				t.Errorf("the rendered page has no %q:\n%s", want, dom)
			}
		}
		m := deniedRate.FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("no denied rate for activity_create in the rendered page:\n%s", dom)
		}
		rate, err := strconv.ParseFloat(m[1], 64)
		n := float64(denied.Load())
		if err != nil || rate < n/70*0.99 || rate > n/60*1.01 {
			t.Errorf("activity_create's denied rate reads %q, want %d 429s over 60 to 70 s", m[1], int(n))
		}
	})
}

// deniedRate is activity_create's denied-per-second cell on the page.
var deniedRate = regexp.MustCompile(`(?s)href="#b-activity_create".*?<td class="n denied">([0-9.e+]+)</td>`)

// browserDOM loads url in headless Chromium (Debian's chromium, or
// $E2E_CHROMIUM) and returns the document it rendered; it also leaves a
// screenshot in dir.
func browserDOM(t *testing.T, dir, url string) string {
	t.Helper()
	bin := os.Getenv("E2E_CHROMIUM")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("chromium"); err != nil {
			unavailable(t, "chromium not available (apt-get install chromium, or set E2E_CHROMIUM): %v", err)
		}
	}
	run := func(args ...string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// --no-sandbox: the tests may run as root, which the sandbox refuses.
		args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + t.TempDir()}, args...)
		cmd := exec.CommandContext(ctx, bin, append(args, url)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return out
	}
	run("--window-size=1200,1600", "--screenshot="+filepath.Join(dir, "status-page.png"))
	return string(run("--dump-dom"))
}

// calmKeys is how many calm tenants a flood sends one activity each,
// interleaved one for one with the noisy tenant's (through Envoy about
// ten times activityLimit).
const calmKeys = 10_000

// flood sends calmKeys activities of the tenant "noisy" through Envoy,
// interleaved with one of each of calmKeys calm tenants, and returns the
// 429s noisy got. The last three quarters of the flood, distinct keys
// all, must leave the sketch's memory (ratelimit_authz_top_memory_bytes)
// of every node in httpAddrs as the first quarter left it: by then
// activity_create has its summaries in every shard.
func flood(t *testing.T, s *stack, httpAddrs ...string) int64 {
	t.Helper()
	denied := send(t, s, 0, calmKeys/4)
	before := make([]float64, len(httpAddrs))
	for i, a := range httpAddrs {
		if before[i] = metricOf(t, s.client, a, "ratelimit_authz_top_memory_bytes"); before[i] <= 0 {
			t.Fatalf("%s: top sketch memory %v after %d keys", a, before[i], calmKeys/4)
		}
	}
	denied += send(t, s, calmKeys/4, calmKeys)
	for i, a := range httpAddrs {
		if m := metricOf(t, s.client, a, "ratelimit_authz_top_memory_bytes"); m != before[i] {
			t.Errorf("%s: top sketch memory %v bytes after %d distinct keys, %v after %d", a, m, calmKeys, before[i], calmKeys/4)
		}
	}
	return denied
}

// send posts the activities of calm tenants from to to (one each)
// through Envoy, each followed by one of "noisy", and returns the 429s
// noisy got.
func send(t *testing.T, s *stack, from, to int) int64 {
	t.Helper()
	var denied, errs atomic.Int64
	work := make(chan string)
	var wg sync.WaitGroup
	for range burstWorkers {
		wg.Go(func() {
			for tenant := range work {
				r, err := s.post(activitiesPath, map[string]string{"x-tenant-id": tenant})
				switch {
				case err != nil:
					errs.Add(1)
				case r.status == http.StatusTooManyRequests && tenant == "noisy":
					denied.Add(1)
				}
			}
		})
	}
	for i := from; i < to; i++ {
		work <- fmt.Sprint("calm-", i)
		work <- "noisy"
	}
	close(work)
	wg.Wait()
	if n := errs.Load(); n > 0 {
		t.Fatalf("%d requests failed", n)
	}
	return denied.Load()
}

// readTop GETs the activity_create bucket's tops from the admin listener;
// extra is more of the query (&cluster=1).
func readTop(c *http.Client, addr string, extra ...string) (admin.TopResponse, error) {
	var r admin.TopResponse
	resp, err := c.Get("http://" + addr + "/v1/top?bucket=activity_create&n=3" + strings.Join(extra, ""))
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return r, fmt.Errorf("GET /v1/top: %s", resp.Status)
	}
	return r, json.NewDecoder(resp.Body).Decode(&r)
}

func firstDenied(r admin.TopResponse) string {
	if len(r.Buckets) != 1 || len(r.Buckets[0].Minute.TopDenied) == 0 {
		return ""
	}
	return r.Buckets[0].Minute.TopDenied[0].Key
}
