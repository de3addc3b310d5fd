package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// printer writes the demo's output. On a terminal a progress line is
// redrawn in place with carriage returns; elsewhere (a pipe, a CI log)
// only its final state is printed, as a plain line. Safe for concurrent
// use.
type printer struct {
	mu    sync.Mutex
	w     io.Writer
	term  bool
	drawn int // width of the progress line on screen; 0: none
}

func newPrinter(w io.Writer, term bool) *printer { return &printer{w: w, term: term} }

// linef prints a whole line.
func (p *printer) linef(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// progress redraws the progress line (terminals only).
func (p *printer) progress(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.term {
		p.draw(s)
	}
}

// progressDone prints the progress line's final state and ends it.
func (p *printer) progressDone(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.term {
		p.draw(s)
		p.drawn = 0
		io.WriteString(p.w, "\n")
		return
	}
	io.WriteString(p.w, s+"\n")
}

// redraw calls progress(line()) every redrawEvery until the returned stop
// is called; stop waits for the last redraw. A no-op off a terminal.
func (p *printer) redraw(line func() string) (stop func()) {
	if !p.term {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(redrawEvery)
		defer t.Stop()
		for {
			p.progress(line())
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-exited }
}

func (p *printer) draw(s string) {
	n := utf8.RuneCountInString(s)
	fmt.Fprintf(p.w, "\r%s%s", s, strings.Repeat(" ", max(p.drawn-n, 0)))
	p.drawn = n
}

// clear blanks an unfinished progress line before a whole line is printed.
func (p *printer) clear() {
	if p.drawn > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.drawn))
		p.drawn = 0
	}
}

// report prints the table of results, its notes, and one 429 as the
// client saw it.
func report(out *printer, rows []*row) {
	header := []string{"bucket", "requests", "sent", "2xx", "429", "other", "app saw", "Retry-After", "RateLimit-Policy"}
	numeric := []bool{false, false, true, true, true, false, true, true, false}
	table := [][]string{header}
	var notes []string
	for _, r := range rows {
		mark := ""
		for _, n := range r.notes {
			notes = append(notes, fmt.Sprintf("(%d) %s: %s", len(notes)+1, r.bucket, n))
			mark += fmt.Sprintf(" (%d)", len(notes))
		}
		table = append(table, []string{
			r.bucket, r.what + mark,
			strconv.Itoa(r.sent), strconv.Itoa(r.ok), strconv.Itoa(r.denied), orDash(r.otherText()),
			strconv.Itoa(r.upstream), retryText(r.retryMin, r.retryMax), orDash(r.policy),
		})
	}
	widths := make([]int, len(header))
	for _, cells := range table {
		for i, c := range cells {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, cells := range table {
		var b strings.Builder
		for i, c := range cells {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			switch {
			case i == len(cells)-1:
				b.WriteString(c) // no trailing blanks
			case numeric[i]:
				b.WriteString(pad + c + "  ")
			default:
				b.WriteString(c + pad + "  ")
			}
		}
		out.linef("%s", b.String())
	}
	for _, n := range notes {
		out.linef("%s", n)
	}
	out.linef("")
	out.linef("2xx: allowed, answered by the app. 429: refused at Envoy by ratelimit-authz; never reached the app.")
	out.linef("Windows are fixed and aligned to the wall clock: Retry-After counts down to the end of the second or minute.")

	for _, r := range rows {
		if r.sample == nil {
			continue
		}
		out.linef("")
		out.linef("A 429 as the client saw it (%s):", r.bucket)
		out.linef("  HTTP/1.1 %d %s", r.sample.status, http.StatusText(r.sample.status))
		for _, h := range []string{"Retry-After", "RateLimit-Policy", "RateLimit", "Content-Type"} {
			if v := r.sample.header.Values(h); len(v) > 0 {
				out.linef("  %s: %s", strings.ToLower(h), strings.Join(v, ", "))
			}
		}
		out.linef("  %s", strings.TrimSpace(string(r.sample.body)))
		break
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func retryText(lo, hi int) string {
	switch {
	case hi == 0:
		return "-"
	case lo == hi:
		return fmt.Sprintf("%d s", lo)
	}
	return fmt.Sprintf("%d-%d s", lo, hi)
}

// check returns an error listing every row that did not behave as the
// shipped configuration says: requests that failed or got 5xx, a flood
// without 429 (or a quiet key with one), denied requests that reached the
// app anyway.
func check(rows []*row) error {
	var problems []string
	add := func(r *row, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s (%s): %s", r.bucket, r.what, fmt.Sprintf(format, args...)))
	}
	for _, r := range rows {
		if n := r.other["error"]; n > 0 {
			add(r, "%d requests failed, the first with: %v", n, r.firstErr)
		}
		for code, n := range r.other {
			if c, err := strconv.Atoi(code); err == nil && c >= 500 {
				hint := ""
				if c == http.StatusServiceUnavailable {
					hint = " (Envoy's status_on_error: ratelimit-authz failed or was unreachable)"
				}
				add(r, "%d answers %d%s", n, c, hint)
			}
		}
		switch {
		case r.want429 && r.denied == 0:
			add(r, "no 429 in %d requests; the shipped limits should refuse some", r.sent)
		case !r.want429 && r.denied > 0:
			add(r, "%d × 429; the shipped limits should admit all", r.denied)
		}
		passed := r.sent - r.denied - r.other["error"]
		for code, n := range r.other {
			if c, err := strconv.Atoi(code); err == nil && c >= 500 {
				passed -= n // Envoy's own answers, never the app's
			}
		}
		if r.upstream != passed {
			add(r, "the app saw %d requests, want %d (those not refused)", r.upstream, passed)
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return errors.New("the demo did not behave as the shipped configuration says:\n  - " + strings.Join(problems, "\n  - "))
}
