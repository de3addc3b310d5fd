package scrape_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

const page = `# HELP x y
# TYPE ratelimit_authz_counter_live_keys gauge
ratelimit_authz_counter_live_keys 1e+06
ratelimit_authz_checks_total{bucket="a",decision="allowed"} 5
ratelimit_authz_checks_total{bucket="b",decision="denied"} 7 1700000000000
ratelimit_authz_checks_total_other 100
odd{v="a \"quoted\" } brace, comma",w="x\\y\nz"} -Inf
process_resident_memory_bytes 2.5e+07
`

func TestParse(t *testing.T) {
	s, err := scrape.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 6 {
		t.Fatalf("%d samples, want 6: %+v", len(s), s)
	}
	for name, want := range map[string]float64{
		"ratelimit_authz_counter_live_keys": 1e6, "ratelimit_authz_checks_total": 12, "process_resident_memory_bytes": 2.5e7, "nothing": 0,
	} {
		if got := s.Sum(name); got != want {
			t.Errorf("Sum(%s) = %v, want %v", name, got, want)
		}
	}
	if v, ok := s.Get(`ratelimit_authz_checks_total{bucket="b",decision="denied"}`); !ok || v != 7 {
		t.Errorf("Get(exposed series) = %v, %v, want 7", v, ok)
	}
	if _, ok := s.Get(`ratelimit_authz_checks_total{decision="denied",bucket="b"}`); ok {
		t.Error("Get matched labels in another order: it reads the series as written")
	}
	if _, ok := s.Get("ratelimit_authz_checks_total"); ok {
		t.Error("Get of a bare name matched a labelled series")
	}
	if v, ok := s.Match("ratelimit_authz_checks_total", "decision", "denied"); !ok || v != 7 {
		t.Errorf("Match(decision=denied) = %v, %v, want 7", v, ok)
	}
	if _, ok := s.Match("ratelimit_authz_checks_total", "decision", "deni"); ok {
		t.Error("Match took a label value prefix")
	}
	if _, ok := s.Match("ratelimit_authz_checks_total", "decision"); ok {
		t.Error("Match with an odd label list matched")
	}
	if v, ok := s.Match("odd", "v", `a "quoted" } brace, comma`, "w", "x\\y\nz"); !ok || v > -1e308 {
		t.Errorf("escaped labels: %v, %v; samples %+v", v, ok, s)
	}
}

func TestParseRefusesMalformedPages(t *testing.T) {
	for _, bad := range []string{
		"novalue\n",
		"x notanumber\n",
		"x 1 2 3\n",
		"x 1 notatime\n",
		`x{a="1" 1` + "\n",
		`x{a=1} 1` + "\n",
		`x{a="1",a="2"} 1` + "\n",
		`x{a="\q"} 1` + "\n",
		`x{a="1"junk} 1` + "\n",
		`x{="1"} 1` + "\n",
		"9x 1\n",
		"x 1\nx 2\n",
		strings.Repeat("x", scrape.MaxLine+1) + " 1\n",
	} {
		if s, err := scrape.Parse(strings.NewReader(bad)); err == nil {
			t.Errorf("Parse(%.60q) = %+v, want an error", bad, s)
		}
	}
}

func TestParseEnvoyStats(t *testing.T) {
	got, err := scrape.ParseEnvoyStats(strings.NewReader(`http.in.ext_authz.ok: 12
http.in.ext_authz.denied: 0
cluster.limiter.upstream_rq_time: P0(nan,1) P25(nan,2) P50(nan,3)
cluster.limiter.upstream_cx_length_ms: No recorded values
server.version_text: "1.40.0"
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["http.in.ext_authz.ok"] != 12 || got["http.in.ext_authz.denied"] != 0 {
		t.Errorf("stats %v", got)
	}
	for _, bad := range []string{"no colon\n", "x: 1.5\n", ": 1\n", "a b: 1\n"} {
		if _, err := scrape.ParseEnvoyStats(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseEnvoyStats(%q) gave no error", bad)
		}
	}
}

// Get and EnvoyStats over HTTP: the body is read, the filter escaped, a
// status other than 200 is an error.
func TestOverHTTP(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hits_total"}, []string{"code"})
	reg.MustRegister(c)
	c.WithLabelValues("200").Add(3)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	var filter string
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		filter = r.URL.Query().Get("filter")
		w.Write([]byte("a.b: 4\n"))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	client := &http.Client{Timeout: 5 * time.Second}

	s, err := scrape.Get(client, srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Get(`hits_total{code="200"}`); !ok || v != 3 {
		t.Errorf("hits_total = %v, %v; page %+v", v, ok, s)
	}
	stats, err := scrape.EnvoyStats(client, srv.URL, `^a\.b$|x&y`)
	if err != nil || stats["a.b"] != 4 || filter != `^a\.b$|x&y` {
		t.Errorf("EnvoyStats = %v, %v; filter arrived as %q", stats, err, filter)
	}
	if _, err := scrape.Get(client, srv.URL+"/nothing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Get of a 404: %v", err)
	}
}

func TestGathered(t *testing.T) {
	reg := prometheus.NewRegistry()
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"bucket", "decision"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h_seconds"})
	s := prometheus.NewSummary(prometheus.SummaryOpts{Name: "s"})
	reg.MustRegister(cv, g, h, s)
	cv.WithLabelValues("a", "allowed").Add(2)
	cv.WithLabelValues("b", "denied").Add(5)
	g.Set(-3)
	h.Observe(1)
	h.Observe(2)
	s.Observe(1)

	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
		ok     bool
	}{
		{"c_total", []string{"bucket", "b"}, 5, true},
		{"c_total", []string{"bucket", "b", "decision", "denied"}, 5, true},
		{"c_total", []string{"bucket", "b", "decision", "allowed"}, 0, false},
		{"c_total", []string{"bucket", "c"}, 0, false},
		{"c_total", nil, 2, true},
		{"g", nil, -3, true},
		{"h_seconds", nil, 2, true},
		{"absent", nil, 0, false},
	} {
		v, ok, err := scrape.Gathered(reg, tc.name, tc.labels...)
		if err != nil || v != tc.want || ok != tc.ok {
			t.Errorf("Gathered(%s, %q) = %v, %v, %v; want %v, %v", tc.name, tc.labels, v, ok, err, tc.want, tc.ok)
		}
	}
	if _, _, err := scrape.Gathered(reg, "c_total", "bucket"); err == nil {
		t.Error("odd label list gave no error")
	}
	if _, _, err := scrape.Gathered(reg, "s"); err == nil {
		t.Error("a summary read as a value")
	}
	if v, err := scrape.Value(g); err != nil || v != -3 {
		t.Errorf("Value(gauge) = %v, %v", v, err)
	}
	if v, err := scrape.Value(cv.WithLabelValues("a", "allowed")); err != nil || v != 2 {
		t.Errorf("Value(counter) = %v, %v", v, err)
	}
	if _, err := scrape.Value(s); err == nil {
		t.Error("Value of a summary gave no error")
	}
}

// A page that Parse accepts keeps every sample's series and name
// consistent; hostile pages never panic.
func FuzzParse(f *testing.F) {
	f.Add(page)
	f.Add(`x{a="\\",b="\n"} NaN`)
	f.Add(`x{a="}"} +Inf 1`)
	f.Add("x{")
	f.Add(`x{a="`)
	f.Fuzz(func(t *testing.T, text string) {
		s, err := scrape.Parse(strings.NewReader(text))
		if err != nil {
			return
		}
		for _, x := range s {
			if !strings.HasPrefix(x.Series, x.Name) || (x.Labels == nil) != (x.Series == x.Name) {
				t.Fatalf("sample %+v", x)
			}
			if _, ok := s.Get(x.Series); !ok {
				t.Fatalf("Get(%q) missed a parsed series", x.Series)
			}
		}
	})
}

func FuzzParseEnvoyStats(f *testing.F) {
	f.Add("http.in.ext_authz.ok: 12\nx: P0(nan,1)\n")
	f.Add("a: -9223372036854775808\n")
	f.Add("a: 99999999999999999999\n")
	f.Fuzz(func(t *testing.T, text string) {
		stats, err := scrape.ParseEnvoyStats(strings.NewReader(text))
		if err != nil {
			return
		}
		for name := range stats {
			if name == "" || strings.ContainsAny(name, " \t\n") {
				t.Fatalf("stat name %q", name)
			}
		}
	})
}

// fatalT records a Fatal instead of stopping the test.
type fatalT struct{ failed []any }

func (f *fatalT) Helper()           {}
func (f *fatalT) Fatal(args ...any) { f.failed = args }

func TestMustAndRead(t *testing.T) {
	reg := prometheus.NewRegistry()
	cv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"bucket"})
	reg.MustRegister(cv)
	cv.WithLabelValues("a").Inc()
	var ft fatalT
	if v := scrape.Must(&ft, reg, "c_total", "bucket", "a"); v != 1 || ft.failed != nil {
		t.Errorf("Must of a present series = %v, failed %v", v, ft.failed)
	}
	if scrape.Must(&ft, reg, "c_total", "bucket", "b"); ft.failed == nil {
		t.Error("Must of an absent series did not fail the test")
	}
	ft = fatalT{}
	if v := scrape.Read(&ft, reg, "c_total", "bucket", "b"); v != 0 || ft.failed != nil {
		t.Errorf("Read of an absent series = %v, failed %v", v, ft.failed)
	}
	if scrape.Read(&ft, reg, "c_total", "bucket"); ft.failed == nil {
		t.Error("Read with an odd label list did not fail the test")
	}
}

func TestPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("not ready\n"))
	}))
	defer srv.Close()
	if code, body := scrape.Page(t, srv.URL+"/readyz"); code != 503 || body != "not ready\n" {
		t.Errorf("Page = %d %q", code, body)
	}
	addr := srv.Listener.Addr().String()
	srv.Close()
	var ft fatalT
	if scrape.Page(&ft, "http://"+addr+"/readyz"); ft.failed == nil {
		t.Error("Page of a closed server did not fail the test")
	}
}
