// Package scrape reads metric samples for tests and the bench: from a
// Prometheus registry, from a /metrics page in the text exposition format,
// and from Envoy's admin /stats; and, for a test, any page's status and
// body.
//
// Parsing is strict: a line that is not a sample, comment or blank line is
// an error, not skipped, so a reader never silently reports an absent
// series as zero. Readers bound what they read (MaxBytes, MaxLine). The
// package imports no testing code, so the bench binary may use it.
package scrape

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

const (
	// MaxBytes bounds the body Get and EnvoyStats read.
	MaxBytes = 64 << 20
	// MaxLine bounds one line of a page.
	MaxLine = 1 << 20
)

// Sample is one series of a text page.
type Sample struct {
	Series string            // as exposed: name or name{label="v",…}
	Name   string            // the metric name
	Labels map[string]string // nil when the series has none
	Value  float64
}

// Samples are a page's series in the order written. Lookups are linear: a
// page has at most a few thousand series and tests read a handful.
type Samples []Sample

// Get returns the value of the series written exactly as series (the name
// and, if any, its labels in exposition order).
func (s Samples) Get(series string) (float64, bool) {
	for _, x := range s {
		if x.Series == series {
			return x.Value, true
		}
	}
	return 0, false
}

// Match returns the value of the first series of name whose labels
// include every name/value pair in labels. An odd labels list matches
// nothing.
func (s Samples) Match(name string, labels ...string) (float64, bool) {
	if len(labels)%2 != 0 {
		return 0, false
	}
next:
	for _, x := range s {
		if x.Name != name {
			continue
		}
		for i := 0; i < len(labels); i += 2 {
			if v, ok := x.Labels[labels[i]]; !ok || v != labels[i+1] {
				continue next
			}
		}
		return x.Value, true
	}
	return 0, false
}

// Sum adds the values of every series of name, whatever their labels.
func (s Samples) Sum(name string) float64 {
	var sum float64
	for _, x := range s {
		if x.Name == name {
			sum += x.Value
		}
	}
	return sum
}

// Parse reads a page in the Prometheus text exposition format. A series
// written twice is an error.
func Parse(r io.Reader) (Samples, error) {
	var out Samples
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		x, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("scrape: line %d: %w", n, err)
		}
		if seen[x.Series] {
			return nil, fmt.Errorf("scrape: line %d: series %s written twice", n, x.Series)
		}
		seen[x.Series] = true
		out = append(out, x)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scrape: %w", err)
	}
	return out, nil
}

// parseSample reads `name[{labels}] value [timestamp]`.
func parseSample(line string) (Sample, error) {
	var x Sample
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return x, fmt.Errorf("no value in %q", line)
	}
	x.Name = line[:i]
	if !validName(x.Name) {
		return x, fmt.Errorf("bad metric name in %q", line)
	}
	rest := line[i:]
	if rest[0] == '{' {
		labels, n, err := parseLabels(rest)
		if err != nil {
			return x, fmt.Errorf("%w in %q", err, line)
		}
		x.Labels = labels
		rest = rest[n:]
	}
	x.Series = line[:len(line)-len(rest)]
	f := strings.Fields(rest)
	if len(f) < 1 || len(f) > 2 {
		return x, fmt.Errorf("want a value and at most a timestamp in %q", line)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return x, fmt.Errorf("value of %s: %w", x.Series, err)
	}
	if len(f) == 2 {
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			return x, fmt.Errorf("timestamp of %s: %w", x.Series, err)
		}
	}
	x.Value = v
	return x, nil
}

// parseLabels reads `{a="x",b="y\"z"}` at the start of s and returns the
// labels and the bytes consumed.
func parseLabels(s string) (map[string]string, int, error) {
	labels := map[string]string{}
	i := 1 // past '{'
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == ',') {
			i++
		}
		if i < len(s) && s[i] == '}' {
			return labels, i + 1, nil
		}
		j := strings.IndexByte(s[i:], '=')
		if j <= 0 {
			return nil, 0, errors.New("unterminated labels")
		}
		name := strings.TrimSpace(s[i : i+j])
		if !validName(name) {
			return nil, 0, fmt.Errorf("bad label name %q", name)
		}
		i += j + 1
		if i >= len(s) || s[i] != '"' {
			return nil, 0, fmt.Errorf("label %s: value not quoted", name)
		}
		i++
		var v strings.Builder
		for ; i < len(s) && s[i] != '"'; i++ {
			c := s[i]
			if c == '\\' {
				if i++; i == len(s) {
					break
				}
				switch s[i] {
				case 'n':
					c = '\n'
				case '\\', '"':
					c = s[i]
				default:
					return nil, 0, fmt.Errorf("label %s: bad escape \\%c", name, s[i])
				}
			}
			v.WriteByte(c)
		}
		if i >= len(s) {
			return nil, 0, fmt.Errorf("label %s: unterminated value", name)
		}
		i++ // past the closing quote
		if _, dup := labels[name]; dup {
			return nil, 0, fmt.Errorf("label %s twice", name)
		}
		labels[name] = v.String()
		if i < len(s) && s[i] != ',' && s[i] != '}' && s[i] != ' ' {
			return nil, 0, fmt.Errorf("label %s: junk after the value", name)
		}
	}
}

// validName reports whether s is a metric or label name:
// [a-zA-Z_:][a-zA-Z0-9_:]*.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Get fetches a /metrics page and parses it. A status other than 200 is
// an error.
func Get(c *http.Client, url string) (Samples, error) {
	return fetch(c, url, Parse)
}

// EnvoyStats fetches the integer stats (counters and gauges) of an Envoy
// admin listener, base like http://127.0.0.1:9901, whose names match the
// regular expression filter (Envoy's own /stats?filter=).
func EnvoyStats(c *http.Client, base, filter string) (map[string]int64, error) {
	return fetch(c, base+"/stats?filter="+url.QueryEscape(filter), ParseEnvoyStats)
}

// fetch GETs url and parses at most MaxBytes of a 200 answer's body.
func fetch[T any](c *http.Client, url string, parse func(io.Reader) (T, error)) (T, error) {
	var zero T
	resp, err := c.Get(url)
	if err != nil {
		return zero, fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return zero, fmt.Errorf("scrape: GET %s: %s", url, resp.Status)
	}
	v, err := parse(io.LimitReader(resp.Body, MaxBytes))
	if err != nil {
		return zero, fmt.Errorf("scrape: %s: %w", url, err)
	}
	return v, nil
}

// ParseEnvoyStats reads Envoy's plain /stats format, `name: value` a
// line. Histogram lines (`name: P0(…) …`, `name: No recorded values`)
// and text readouts (`name: "text"`) are left out; any other line
// that is not `name: integer` is an error.
func ParseEnvoyStats(r io.Reader) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		name, val, ok := strings.Cut(line, ": ")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("envoy stats line %d: %q is not name: value", n, line)
		}
		v, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			if strings.HasPrefix(val, "P0(") || val == "No recorded values" || strings.HasPrefix(val, `"`) {
				continue // a histogram or a text readout
			}
			return nil, fmt.Errorf("envoy stats line %d: %s: %w", n, name, err)
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("envoy stats: %w", err)
	}
	return out, nil
}

// Gathered returns the value of the first series of family name in g
// whose labels include every name/value pair in labels: a counter's or a
// gauge's value, or a histogram's sample count. ok is false when no series
// matches. An odd labels list, or a matching series of another type, is an
// error.
func Gathered(g prometheus.Gatherer, name string, labels ...string) (v float64, ok bool, err error) {
	if len(labels)%2 != 0 {
		return 0, false, fmt.Errorf("scrape: %s: labels %q are not name, value pairs", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		return 0, false, fmt.Errorf("scrape: gather: %w", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, labels) {
				continue
			}
			v, err := value(m)
			if err != nil {
				return 0, false, fmt.Errorf("scrape: %s: %w", name, err)
			}
			return v, true, nil
		}
	}
	return 0, false, nil
}

// Value reads one metric: a counter's or a gauge's value, or a histogram's
// sample count.
func Value(m prometheus.Metric) (float64, error) {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return 0, fmt.Errorf("scrape: %v: %w", m.Desc(), err)
	}
	v, err := value(&d)
	if err != nil {
		return 0, fmt.Errorf("scrape: %v: %w", m.Desc(), err)
	}
	return v, nil
}

func value(m *dto.Metric) (float64, error) {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), nil
	case m.Gauge != nil:
		return m.Gauge.GetValue(), nil
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount()), nil
	}
	return 0, errors.New("not a counter, gauge or histogram")
}

func hasLabels(m *dto.Metric, pairs []string) bool {
next:
	for i := 0; i < len(pairs); i += 2 {
		for _, l := range m.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				continue next
			}
		}
		return false
	}
	return true
}

// TB is the part of testing.TB that Must and Read use; declared here so
// that this package does not import testing.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Must is Gathered for a test: it stops the test on an error or when no
// series matches.
func Must(t TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok, err := Gathered(g, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatal(fmt.Sprintf("scrape: no series %s with labels %q", name, labels))
	}
	return v
}

// Read is Gathered for a test where a series not yet created counts as 0:
// it stops the test on an error.
func Read(t TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, _, err := Gathered(g, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Page GETs url for a test, with a 5 s timeout and no proxy, and returns
// the status code and at most MaxBytes of the body; it stops the test when
// no answer comes.
func Page(t TB, url string) (status int, body string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(fmt.Sprintf("GET %s: %v", url, err))
		return 0, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxBytes))
	if err != nil {
		t.Fatal(fmt.Sprintf("GET %s: read the body: %v", url, err))
	}
	return resp.StatusCode, string(b)
}
