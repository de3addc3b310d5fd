package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/exampleapp"
)

const (
	workers      = 16                     // concurrent requests in a burst
	alignAfter   = 10 * time.Millisecond  // a burst starts this long after a window boundary
	minuteMargin = 10 * time.Second       // a minute burst needs this much of its minute left
	loginPoll    = 50 * time.Millisecond  // between tries of the right password
	loginWait    = 5 * time.Second        // longest wait for the lockout to show
	maxBody      = 64 << 10               // of an answer, read at most
	redrawEvery  = 100 * time.Millisecond // progress line on a terminal
)

// request is one POST through Envoy's listener.
type request struct {
	path   string
	header map[string]string
	body   string // JSON; "{}" when empty
}

// result is one answer (or transport error) as the client saw it.
type result struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (d *demo) do(ctx context.Context, r request) result {
	body := r.body
	if body == "" {
		body = "{}"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.addrs.Listener+r.path, strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	return result{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// row is one line of the report: requests of one kind and their answers.
type row struct {
	bucket  string  // the bucket(s) the requests spend from
	label   string  // the key, short, for the progress line
	what    string  // the requests, for the table
	req     request // what a burst sends n times
	n       int     // requests planned
	want429 bool    // the shipped limits refuse some of them; else none

	mu       sync.Mutex
	sent     int
	ok       int            // 2xx
	denied   int            // 429
	other    map[string]int // other status codes, and "error"
	firstErr error
	retryMin int // seconds, over the 429s; 0: none seen
	retryMax int
	policy   string  // RateLimit-Policy of the first 429, else of the first answer
	sample   *result // the first 429
	upstream int     // requests that reached the app
	notes    []string
}

func (r *row) record(res result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent++
	if res.err != nil {
		r.count("error")
		if r.firstErr == nil {
			r.firstErr = res.err
		}
		return
	}
	switch {
	case res.status == http.StatusTooManyRequests:
		r.denied++
		if s, err := strconv.Atoi(res.header.Get("Retry-After")); err == nil {
			if r.retryMin == 0 || s < r.retryMin {
				r.retryMin = s
			}
			r.retryMax = max(r.retryMax, s)
		}
		if r.sample == nil {
			r.sample = &res
			r.policy = res.header.Get("RateLimit-Policy")
		}
	case res.status >= 200 && res.status < 300:
		r.ok++
	default:
		r.count(strconv.Itoa(res.status))
	}
	if r.policy == "" {
		r.policy = res.header.Get("RateLimit-Policy")
	}
}

func (r *row) count(what string) {
	if r.other == nil {
		r.other = map[string]int{}
	}
	r.other[what]++
}

// otherText is "5 × 401, 2 × error", or "" when there were none.
func (r *row) otherText() string {
	keys := make([]string, 0, len(r.other))
	for k := range r.other {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d × %s", r.other[k], k)
	}
	return strings.Join(parts, ", ")
}

// progress is the row's part of a progress line.
func (r *row) progress() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := fmt.Sprintf("%s %d/%d: %d ok, %d × 429", r.label, r.sent, max(r.n, r.sent), r.ok, r.denied)
	if o := r.otherText(); o != "" {
		s += ", " + o
	}
	return s
}

// burst is requests sent together within one window of the buckets.
type burst struct {
	window time.Duration // the buckets' window; 1 s bursts start just after a second boundary
	rows   []*row
}

// plan is what the demo sends: a burst per bucket of the shipped
// configuration, sized by its limits (100/s, 10/s, 500/s, 10/min, 10/min).
func plan() []burst {
	acme := map[string]string{"x-tenant-id": "acme"}
	return []burst{
		{window: time.Second, rows: []*row{{
			bucket: "activity_create", label: "tenant acme", what: "POST /api/activities (tenant acme)",
			req: request{path: "/api/activities", header: acme}, n: 150, want429: true,
		}}},
		{window: time.Second, rows: []*row{{
			bucket: "upload", label: "tenant acme", what: "POST /api/converger/uploads (tenant acme)",
			req: request{path: "/api/converger/uploads", header: acme}, n: 20, want429: true,
		}}},
		{window: time.Second, rows: []*row{{
			bucket: "inbound", label: "flood", what: "POST /api/inbound/flood",
			req: request{path: "/api/inbound/flood"}, n: 600, want429: true,
		}, {
			bucket: "inbound", label: "quiet", what: "POST /api/inbound/quiet (same second)",
			req: request{path: "/api/inbound/quiet"}, n: 50,
		}}},
		{window: time.Minute, rows: []*row{{
			bucket: "token_generate", label: "channel ch-7", what: "POST /api/converger/channels/ch-7/token",
			req: request{path: "/api/converger/channels/ch-7/token"}, n: 15, want429: true,
		}}},
		{window: time.Minute, rows: []*row{{
			bucket: "token_create", label: "one client IP", what: "POST /api/v1/tokens (one client IP)",
			req: request{path: "/api/v1/tokens"}, n: 15, want429: true,
		}}},
	}
}

// fire runs the plan and the login sequence, prints the report, and says
// whether everything behaved as the shipped configuration promises.
func (d *demo) fire(ctx context.Context) error {
	d.out.linef("")
	d.out.linef("bursts through Envoy (http://%s):", d.addrs.Listener)
	for _, b := range plan() {
		err := d.runBurst(ctx, b)
		d.results = append(d.results, b.rows...)
		if err != nil {
			return err
		}
	}
	login, err := d.runLogin(ctx)
	d.results = append(d.results, login)
	if err != nil {
		return err
	}
	d.out.linef("")
	report(d.out, d.results)
	if err := check(d.results); err != nil {
		return err
	}
	return d.liveView(ctx)
}

// runBurst sends every row's requests, interleaved, from workers
// goroutines, within one window of the buckets. Sending stops early when
// the window is nearly over, so that a slow machine shows fewer requests
// sent rather than a burst spread over two windows.
func (d *demo) runBurst(ctx context.Context, b burst) error {
	stopAt, end, err := d.waitForWindow(ctx, b.window)
	if err != nil {
		return err
	}
	before := make([]int, len(b.rows))
	for i, r := range b.rows {
		before[i] = d.app.Hits(r.req.path)
	}
	line := func() string {
		parts := make([]string, len(b.rows))
		for i, r := range b.rows {
			parts[i] = r.progress()
		}
		return fmt.Sprintf("  %-16s %s", b.rows[0].bucket, strings.Join(parts, "; "))
	}
	stopRedraw := d.out.redraw(line)

	jobs := make(chan *row)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for r := range jobs {
				r.record(d.do(ctx, r.req))
			}
		})
	}
	began := time.Now()
	for _, i := range interleave(b.rows) {
		if !time.Now().Before(stopAt) || ctx.Err() != nil {
			break
		}
		select {
		case jobs <- b.rows[i]:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	took := time.Since(began)
	stopRedraw()
	d.out.progressDone(fmt.Sprintf("%s  (%.2f s)", line(), took.Seconds()))

	late := time.Now().After(end)
	for i, r := range b.rows {
		r.upstream = d.app.Hits(r.req.path) - before[i]
		if r.sent < r.n {
			r.notes = append(r.notes, fmt.Sprintf("only %d of %d requests were sent within the window (slow machine)", r.sent, r.n))
		}
		if late {
			r.notes = append(r.notes, "the last answers came after the window ended; some checks may have counted in the next window")
		}
	}
	return ctx.Err()
}

// interleave returns row indexes, each row's n spread evenly over the
// whole sequence, so a small row is sent throughout a large one's burst.
func interleave(rows []*row) []int {
	type slot struct {
		at  float64
		row int
	}
	var slots []slot
	for i, r := range rows {
		for j := range r.n {
			slots = append(slots, slot{at: (float64(j) + 0.5) / float64(r.n), row: i})
		}
	}
	slices.SortStableFunc(slots, func(a, b slot) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	out := make([]int, len(slots))
	for i, s := range slots {
		out[i] = s.row
	}
	return out
}

// waitForWindow waits until a window of length w (fixed, aligned to the
// Unix epoch like the server's counters) has room for a burst, and returns
// when to stop sending and when the window ends. Windows up to a second
// start at the next boundary; longer ones start now unless less than
// minuteMargin is left.
func (d *demo) waitForWindow(ctx context.Context, w time.Duration) (stopAt, end time.Time, err error) {
	now := time.Now()
	next := windowEnd(now, w)
	start, end := now, next
	if w <= time.Second || next.Sub(now) < minuteMargin {
		start, end = next.Add(alignAfter), next.Add(w)
		if wait := start.Sub(now); wait > time.Second {
			d.out.linef("  (waiting %.0f s for the next %s, so that the burst stays in one window)", wait.Seconds(), windowName(w))
		}
	}
	if !cli.Sleep(ctx, time.Until(start)) {
		return stopAt, end, ctx.Err()
	}
	return end.Add(-min(w*15/100, 2*time.Second)), end, nil
}

func windowName(w time.Duration) string {
	switch w {
	case time.Second:
		return "second"
	case time.Minute:
		return "minute"
	}
	return w.String() + " window"
}

// windowEnd is the end of the window of length w that holds t.
func windowEnd(t time.Time, w time.Duration) time.Time {
	ms := w.Milliseconds()
	return time.UnixMilli((t.UnixMilli()/ms + 1) * ms)
}

// runLogin shows the login lockout: five wrong passwords for one account
// (the app answers 401, and Envoy's access log reports each to the
// server), then the right password, tried until it is refused with 429.
// The access log is asynchronous, so the first tries may still pass.
func (d *demo) runLogin(ctx context.Context) (*row, error) {
	const account = "alice@example.com"
	r := &row{
		bucket: "login_ip/account", label: account, n: 6, want429: true,
		what: "POST /admin/login (5 wrong passwords, then the right one)",
		req:  request{path: "/admin/login"},
	}
	if _, _, err := d.waitForWindow(ctx, time.Minute); err != nil {
		return r, err
	}
	before := d.app.Hits(r.req.path)
	line := func() string { return fmt.Sprintf("  %-16s %s", r.bucket, r.progress()) }
	stopRedraw := d.out.redraw(line)
	defer func() {
		stopRedraw()
		d.out.progressDone(line())
		r.upstream = d.app.Hits(r.req.path) - before
	}()

	wrong := request{path: r.req.path, body: fmt.Sprintf(`{"email":%q,"password":"wrong"}`, account)}
	for range 5 {
		r.record(d.do(ctx, wrong))
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
	}
	right := request{path: r.req.path, body: fmt.Sprintf(`{"email":%q,"password":%q}`, account, exampleapp.Password)}
	deadline := time.Now().Add(loginWait)
	for {
		res := d.do(ctx, right)
		r.record(res)
		if res.status == http.StatusTooManyRequests {
			return r, nil
		}
		if time.Now().After(deadline) {
			r.notes = append(r.notes, fmt.Sprintf("the right password was still accepted after %v: did Envoy's access log reach the server?", loginWait))
			return r, nil
		}
		if !cli.Sleep(ctx, loginPoll) {
			return r, ctx.Err()
		}
	}
}
