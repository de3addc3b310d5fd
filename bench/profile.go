package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
)

// profileParts are the parts of the server whose cumulative CPU share the
// report shows, each found by a substring of a function name.
var profileParts = []struct{ part, fn string }{
	{"gRPC: a whole call (read, decode, handler, encode, write)", "grpc.(*Server).handleStream"},
	{"Check: the handler (descriptors, counter, answer, metrics)", "authz.(*Service).Check"},
	{"descriptors: route match and keys", "descriptors.(*Engine).Describe"},
	{"counter: Take", "counter.(*Store).Take"},
	{"check duration histogram (Observe)", "prometheus.(*histogram).Observe"},
	{"decode the CheckRequest (protobuf)", "proto.UnmarshalOptions.unmarshal"},
	{"encode the CheckResponse (protobuf)", "proto.MarshalOptions.marshal"},
	{"decode the CheckRequest (checkwire codec)", "checkwire.(*Codec).Unmarshal"},
	{"encode the CheckResponse (checkwire codec)", "checkwire.(*Codec).Marshal"},
	{"lean listener: a whole connection (frames, decode, handler, answer)", "checkh2.(*conn).serve"},
	{"HTTP/2 frames in (reader)", "transport.(*http2Server).HandleStreams"},
	{"HTTP/2 frames out (loopy writer)", "transport.(*loopyWriter).run"},
	{"system calls (read, write, futex)", "Syscall6"},
	{"goroutine stack growth (newstack)", "runtime.newstack"},
	{"memory allocation (mallocgc)", "runtime.mallocgc"},
	{"garbage collection (background mark)", "runtime.gcBgMarkWorker"},
	{"scheduler (findRunnable)", "runtime.findRunnable"},
	{"network poller (netpoll)", "runtime.netpoll"},
	{"waking the runtime's monitor thread (entersyscallWakeSysmon)", "runtime.entersyscallWakeSysmon"},
}

// pprofRead is a CPU profile's file and what pprof -top and -top -cum say
// of it.
type pprofRead struct{ path, top, cum string }

// profileUnderLoad runs the load tool with args (bound to cpu; < 0:
// unbound) for secs seconds and 1.5 s more, takes a CPU profile of secs
// seconds of its middle from pprofURL into runs/cpu-NAME.pprof, and reads
// it with pprof: -top of nodecount rows (trimmed) and -top -cum.
func (r *runner) profileUnderLoad(ctx context.Context, cpu int, name, pprofURL string, secs, nodecount int, args ...string) (*loadRun, pprofRead, error) {
	pr := pprofRead{path: filepath.Join(r.runsDir, "cpu-"+name+".pprof")}
	dur := time.Duration(secs)*time.Second + 1500*time.Millisecond
	// These flags come after args' and so override their run and warm-up.
	args = append(args, "--duration", dur.String(), "--warmup", "500ms")
	type loadDone struct {
		res *loadRun
		err error
	}
	done := make(chan loadDone, 1)
	go func() {
		res, err := r.loadOn(ctx, cpu, "profile-"+name, dur+500*time.Millisecond, args...)
		done <- loadDone{res, err}
	}()
	cli.Sleep(ctx, time.Second)
	ferr := fetch(ctx, fmt.Sprintf("%s?seconds=%d", pprofURL, secs), pr.path, time.Duration(secs+15)*time.Second)
	ld := <-done
	if err := cmp.Or(ld.err, ferr); err != nil {
		return nil, pr, err
	}
	top, err := r.runTool(ctx, "pprof-"+name, time.Minute, nil, r.root, "go", "tool", "pprof", "-top", "-nodecount="+strconv.Itoa(nodecount), pr.path)
	if err != nil {
		return nil, pr, err
	}
	cum, err := r.runTool(ctx, "pprof-cum-"+name, time.Minute, nil, r.root, "go", "tool", "pprof", "-top", "-cum", "-nodecount=400", pr.path)
	pr.top, pr.cum = trimPprof(string(top)), string(cum)
	return ld.res, pr, err
}

func fetch(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	c := &http.Client{Transport: &http.Transport{Proxy: nil}}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("fetch profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// trimPprof keeps pprof -top's table (from the "flat" header on) and the
// duration line.
func trimPprof(s string) string {
	var keep []string
	on := false
	for line := range strings.SplitSeq(s, "\n") {
		switch {
		case strings.HasPrefix(line, "Duration:"), strings.HasPrefix(line, "Showing nodes"):
			keep = append(keep, line)
		case strings.Contains(line, "flat%") && strings.Contains(line, "cum%"):
			on = true
			keep = append(keep, line)
		case on && strings.TrimSpace(line) != "":
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// shares reads the cumulative time and cum% of each profile part from
// `pprof -top -cum`; requests is how many checks the profile covers
// (0: unknown), to turn the time into µs per check.
func shares(top string, requests float64) []ProfileShare {
	var out []ProfileShare
	for _, pp := range profileParts {
		best, cum := -1.0, time.Duration(0)
		for line := range strings.SplitSeq(top, "\n") {
			f := strings.Fields(line)
			if len(f) < 6 || !strings.Contains(strings.Join(f[5:], " "), pp.fn) {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSuffix(f[4], "%"), 64)
			if err == nil && v > best {
				best = v
				cum, _ = time.ParseDuration(f[3])
			}
		}
		if best >= 0 {
			s := ProfileShare{Part: pp.part, Share: round(best/100, 4)}
			if requests > 0 {
				s.PerCheckUS = round(float64(cum.Nanoseconds())/1e3/requests, 2)
			}
			out = append(out, s)
		}
	}
	return out
}

// ProfileShare is the cumulative share of the CPU samples in a part of
// the program.
type ProfileShare struct {
	Part       string  `json:"part"`
	Share      float64 `json:"share"` // 0…1
	PerCheckUS float64 `json:"us_per_check"`
}
