package loadresult

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	in := &Result{
		Tool: Tool, Mode: "check", Requests: 10, Sent: 12, ClientCPUS: 0.0006, Allowed: 7, Denied: 3,
		ErrorKinds: map[string]int64{"deadline": 1 << 40}, Latency: Latency{P50: 120, P999: 900},
	}
	b, err := in.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// The names the plots and the report read.
	for _, key := range []string{`"latency_us"`, `"p99_9": 900`, `"error_kinds"`, `"client_cpu_s"`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("JSON lacks %s:\n%s", key, b)
		}
	}
	path := filepath.Join(t.TempDir(), "run.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// An error count beyond 32 bits survives: the schema has one type for it.
	if out.ErrorKinds["deadline"] != 1<<40 || out.Latency.P999 != 900 || out.Denied != 3 {
		t.Errorf("read back %+v", out)
	}
	if got := out.ClientCPUUS(); math.Abs(got-50) > 1e-9 {
		t.Errorf("ClientCPUUS = %v, want 50 (0.6 ms over 12 sent)", got)
	}
	if got := out.DeniedShare(); got != 0.3 {
		t.Errorf("DeniedShare = %v, want 0.3", got)
	}
	var zero Result
	if zero.ClientCPUUS() != 0 || zero.DeniedShare() != 0 {
		t.Error("an empty result divides by zero")
	}
}

func TestReadFileErrors(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"truncated.json": `{"tool": "ratelimit-bench", "rps": 1`,
		"other.json":     `{"tool": "wrk", "rps": 1}`,
		"array.json":     `[1, 2]`,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	if _, err := ReadFile(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file read")
	}
}

func TestMicros(t *testing.T) {
	for us, want := range map[float64]string{0: "0µs", 850.4: "850µs", 999.4: "999µs", 1250: "1.25ms", 2e6: "2.00s"} {
		if got := Micros(us); got != want {
			t.Errorf("Micros(%v) = %q, want %q", us, got, want)
		}
	}
}

// FuzzUnmarshal: any input is decoded or refused, never a panic, and what
// is decoded survives Marshal and Unmarshal unchanged.
func FuzzUnmarshal(f *testing.F) {
	f.Add(`{"tool":"ratelimit-bench","mode":"check","rps":1.5,"error_kinds":{"deadline":3},"windows":[{"start_ms":1,"allowed":2}]}`)
	f.Add(`{"tool":"ratelimit-bench","cdf":[[0.5,120],[1]],"codes":{"-1":9223372036854775807}}`)
	f.Add(`{"tool":"ratelimit-bench","error_kinds":{"x":1e40}}`)
	f.Add(`{"tool":"other"}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, doc string) {
		r, err := Unmarshal([]byte(doc))
		if err != nil {
			return
		}
		b, err := r.Marshal()
		if err != nil {
			return // a NaN or Inf cannot be written; JSON cannot carry one in
		}
		again, err := Unmarshal(b)
		if err != nil {
			t.Fatalf("re-read: %v\n%s", err, b)
		}
		b2, err := again.Marshal()
		if err != nil || string(b2) != string(b) {
			t.Fatalf("not stable:\n%s\n%s", b, b2)
		}
	})
}
