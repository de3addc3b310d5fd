package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

const (
	// maxTopBody bounds the /v1/top answer read: 100 keys of 255 bytes,
	// four lists, a few hundred buckets stay far below it.
	maxTopBody = 32 << 20
	// topKeyWidth is the most runes of a key the table prints.
	topKeyWidth = 40
)

// topConfig is what top's flags set.
type topConfig struct {
	adminURL, bucket, tokenFile string
	n                           int
	interval                    time.Duration
	once, json, cluster         bool
}

// runTop is `top`: the top keys of a node's buckets from its admin
// listener, as a table refreshed every --interval, or once as JSON.
func runTop(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newEnvFlags("top", "Show who is being limited right now: per bucket, the keys with the most denied\n"+
		"and admitted hits over the last minute, from a node's admin listener\n"+
		"(serve --admin-addr), refreshed like top. --once --json prints GET /v1/top\n"+
		"once, for scripts.", getenv)
	var c topConfig
	f.String(&c.adminURL, "admin-addr", "RATELIMIT_AUTHZ_ADMIN_ADDR", defaultAdminAddr, "`address` of the node's admin listener, as serve --admin-addr (host:port), or its URL (http or https)")
	f.fs.StringVar(&c.adminURL, "admin", c.adminURL, "the same as --admin-addr")
	f.String(&c.bucket, "bucket", "RATELIMIT_AUTHZ_TOP_BUCKET", "", "show this `bucket` only; empty: every bucket with hits")
	f.String(&c.tokenFile, "admin-token-file", "RATELIMIT_AUTHZ_ADMIN_TOKEN_FILE", "", "`file` holding the admin listener's bearer token")
	f.Int(&c.n, "n", "RATELIMIT_AUTHZ_TOP_KEYS", 10, "keys per list, 1 to 100")
	f.Duration(&c.interval, "interval", "RATELIMIT_AUTHZ_TOP_INTERVAL", 2*time.Second, "refresh interval, at least 1s")
	f.Bool(&c.cluster, "cluster", "RATELIMIT_AUTHZ_TOP_CLUSTER", false, "the whole cluster's tops: the node asks its peers and names those that do not answer")
	f.Bool(&c.once, "once", "RATELIMIT_AUTHZ_TOP_ONCE", false, "print once and exit")
	f.Bool(&c.json, "json", "RATELIMIT_AUTHZ_TOP_JSON", false, "print GET /v1/top's JSON instead of a table")
	if done, err := cli.Parse(f.fs, args, stdout, stderr); done {
		return err
	}
	if err := errors.Join(f.errs...); err != nil {
		return exitError{code: 2, msg: "ratelimit-authz top: " + err.Error()}
	}
	req, err := c.request()
	if err != nil {
		return exitError{code: 2, msg: "ratelimit-authz top: " + err.Error()}
	}
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for {
		body, resp, err := fetchTop(ctx, client, req)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				return fmt.Errorf("top: no admin listener at %s (serve opens it with --admin-addr, by default %s; give top the node's with --admin-addr): %w", req.URL.Host, defaultAdminAddr, err)
			}
			return fmt.Errorf("top: %w", err)
		}
		if c.json {
			_, _ = stdout.Write(body)
		} else {
			if !c.once && terminal(stdout) {
				fmt.Fprint(stdout, "\x1b[H\x1b[2J") // home, clear
			} else if !c.once {
				fmt.Fprintf(stdout, "--- %s\n", time.Now().Format(time.RFC3339)) // one table after another
			}
			printTop(stdout, resp, c.bucket != "")
		}
		if c.once {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(c.interval):
		}
	}
}

// perSecond is n over secs as a rate in unit ("requests" goes unsaid).
func perSecond(n uint64, secs float64, unit string) string {
	if unit == "requests" || unit == "" {
		return top.Rate(n, secs) + "/s"
	}
	return top.Rate(n, secs) + " " + shown(unit, 40) + "/s"
}

// terminal reports whether w is a terminal (a character device): only
// there does top clear the screen between refreshes.
func terminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// request checks the flags and builds the GET of /v1/top.
func (c *topConfig) request() (*http.Request, error) {
	if c.n < 1 || c.n > 100 {
		return nil, fmt.Errorf("--n %d: from 1 to 100", c.n)
	}
	if c.interval < time.Second {
		return nil, fmt.Errorf("--interval %v: at least 1s", c.interval)
	}
	if c.json && !c.once {
		return nil, errors.New("--json needs --once")
	}
	raw := c.adminURL
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw // host:port, as serve --admin-addr takes it
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--admin-addr %q: want host:port, or an http or https URL with a host", c.adminURL)
	}
	q := url.Values{"n": {strconv.Itoa(c.n)}}
	if c.bucket != "" {
		q.Set("bucket", c.bucket)
	}
	if c.cluster {
		q.Set("cluster", "1")
	}
	u = u.JoinPath("v1", "top")
	u.RawQuery = q.Encode()
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("--admin-addr %q: %w", c.adminURL, err)
	}
	if c.tokenFile != "" {
		tok, err := readSecretFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--admin-token-file: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return req, nil
}

// fetchTop GETs /v1/top and decodes it; it returns the body as received.
func fetchTop(ctx context.Context, client *http.Client, req *http.Request) ([]byte, admin.TopResponse, error) {
	var out admin.TopResponse
	resp, err := client.Do(req.Clone(ctx))
	if err != nil {
		return nil, out, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTopBody+1))
	if err != nil {
		return nil, out, fmt.Errorf("read %s: %w", req.URL.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		line, _, _ := strings.Cut(string(body), "\n")
		return nil, out, fmt.Errorf("GET %s: %s: %s", req.URL.Redacted(), resp.Status, shown(line, 200))
	}
	if len(body) > maxTopBody {
		return nil, out, fmt.Errorf("GET %s: answer larger than %d bytes", req.URL.Redacted(), maxTopBody)
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&out); err != nil {
		return nil, out, fmt.Errorf("GET %s: %w", req.URL.Redacted(), err)
	}
	return body, out, nil
}

// printTop writes the table: per bucket with hits (every bucket when all
// is set), its rates and its top denied and admitted keys side by side.
func printTop(w io.Writer, r admin.TopResponse, all bool) {
	fmt.Fprintf(w, "ratelimit-authz top — %s — the last minute\n", r.Time.Format(time.TimeOnly))
	if len(r.Nodes) > 0 {
		fmt.Fprintf(w, "cluster: %d node(s)", len(r.Nodes))
		if len(r.Missing) > 0 {
			names := make([]string, len(r.Missing))
			for i, m := range r.Missing {
				names[i] = shown(m, 80)
			}
			fmt.Fprintf(w, "; NO ANSWER from %s (their hits are missing)", strings.Join(names, ", "))
		}
		fmt.Fprintln(w)
	}
	listed := 0
	for _, b := range r.Buckets {
		m := b.Minute
		if !all && m.Admitted == 0 && m.Denied == 0 && len(b.InFlight) == 0 {
			continue
		}
		listed++
		secs := max(m.End.Sub(m.Start).Seconds(), 1)
		limit := "per key"
		switch {
		case b.Limit > 0 && b.WindowMS == 0:
			limit = fmt.Sprintf("%d in flight", b.Limit)
		case b.Limit > 0:
			limit = fmt.Sprintf("%d / %s", b.Limit, limits.FormatWindow(b.WindowMS))
		}
		fmt.Fprintf(w, "\n%s  (%s, %s)  admitted %s  denied %s\n", shown(b.Bucket, 80), limit, b.Algorithm,
			perSecond(m.Admitted, secs, b.Unit), perSecond(m.Denied, secs, b.DeniedUnit))
		if len(b.InFlight) > 0 {
			parts := make([]string, len(b.InFlight))
			for i, k := range b.InFlight {
				parts[i] = fmt.Sprintf("%s %d", shown(k.Key, topKeyWidth), k.Hits)
			}
			fmt.Fprintf(w, "in flight now: %s\n", strings.Join(parts, ", "))
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "#\tDENIED KEY\tHITS\t±\tADMITTED KEY\tHITS\t±\t")
		for i := range max(len(m.TopDenied), len(m.TopAdmitted)) {
			row := []string{strconv.Itoa(i + 1)}
			for _, list := range [][]top.Key{m.TopDenied, m.TopAdmitted} {
				if i < len(list) {
					row = append(row, shown(list[i].Key, topKeyWidth), strconv.FormatUint(list[i].Hits, 10), strconv.FormatUint(list[i].Error, 10))
				} else {
					row = append(row, "", "", "")
				}
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
		tw.Flush()
	}
	if listed == 0 {
		fmt.Fprintln(w, "\nno hits in the last minute")
	}
}

// shown is s made safe for a terminal (printable) and cut to width runes.
func shown(s string, width int) string {
	s = printable(s)
	if utf8.RuneCountInString(s) > width {
		s = string([]rune(s)[:width-1]) + "…"
	}
	return s
}
