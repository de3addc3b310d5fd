package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

// rlqsConfig is one `ratelimit-bench rlqs` run: streams acting as Envoys'
// quota filters, each reporting its own bucket ids.
type rlqsConfig struct {
	target, keyPrefix, jsonPath string
	streams, buckets            int
	interval, duration          time.Duration
}

// The quota filter's settings, those of the bench's RLQS configuration:
// its domain, each bucket id's entries (name, and the key entry whose
// values are <key-prefix>k<N>) and the requests each bucket id reports
// allowed per periodic report.
const (
	rlqsDomain, rlqsBucket, rlqsKeyEntry = "example-api", "activity_create", "tenant"
	rlqsPerReport                        = 10
)

func runRLQSCmd(ctx context.Context, cmd command, args []string, stdout, stderr io.Writer) error {
	var c rlqsConfig
	fs := newFlagSet(cmd)
	fs.StringVar(&c.target, "target", "127.0.0.1:9001", "the RLQS server's gRPC `address`")
	fs.IntVar(&c.streams, "streams", 4, "streams, one per simulated Envoy")
	fs.IntVar(&c.buckets, "buckets", 100, "bucket ids each stream reports, each alone at once, then all of them every --interval, as Envoy 1.40.0 does")
	fs.DurationVar(&c.interval, "interval", 5*time.Second, "time between a stream's periodic reports (Envoy 1.40.0: 5s)")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to run")
	fs.StringVar(&c.keyPrefix, "key-prefix", "", "prefix of the bucket ids' key values: separate key spaces for concurrent runs")
	fs.StringVar(&c.jsonPath, "json", "", "also write the result as JSON to this `file` (\"-\": stdout, instead of the text)")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	switch {
	case c.streams < 1 || c.streams > 10000:
		return cli.UsageError{Msg: "--streams: from 1 to 10000"}
	case c.buckets < 1 || c.buckets > 100000:
		return cli.UsageError{Msg: "--buckets: from 1 to 100000"}
	case c.interval < 100*time.Millisecond:
		return cli.UsageError{Msg: "--interval: at least 100ms"}
	case c.duration <= 0:
		return cli.UsageError{Msg: "--duration: must be positive"}
	}
	res, err := rlqsLoad(ctx, c)
	if err != nil {
		return err
	}
	if c.jsonPath != "" {
		if err := writeJSON(c.jsonPath, res, stdout); err != nil || c.jsonPath == "-" {
			return err
		}
	}
	fmt.Fprintf(stdout, "%d streams × %d bucket ids, reports every %v for %.1fs: %d reports (%d usages), %d answers %v; first assignment p50 %.0fµs p99 %.0fµs max %.0fµs; %d errors %v\n",
		res.Streams, res.Buckets, c.interval, res.ElapsedS, res.Reports, res.Usages, res.Answers, res.Actions,
		res.FirstAssign["p50"], res.FirstAssign["p99"], res.FirstAssign["max"], res.Errors, res.ErrorKinds)
	return nil
}

// rlqsLoad runs c and returns its result. A stream that fails counts one
// error and is not reopened: the run measures a steady server.
func rlqsLoad(ctx context.Context, c rlqsConfig) (*loadresult.RLQS, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second) // to connect
	defer cancel()
	conn, err := grpc.NewClient(c.target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", c.target, err)
	}
	defer conn.Close()
	if err := waitReady(dctx, conn, c.target); err != nil {
		return nil, err
	}
	r := &rlqsRun{c: c, client: rlqsv3.NewRateLimitQuotaServiceClient(conn)}
	r.res = &loadresult.RLQS{Tool: loadresult.Tool, Mode: "rlqs", Target: c.target, Streams: c.streams, Buckets: c.buckets,
		IntervalS: c.interval.Seconds(), Actions: map[string]int64{}, ErrorKinds: map[string]int64{}}
	runCtx, stop := context.WithTimeout(ctx, c.duration)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	for s := range c.streams {
		wg.Go(func() { r.stream(runCtx, s) })
	}
	wg.Wait()
	r.finish(time.Since(start))
	return r.res, nil
}

// waitReady connects conn and waits until it is ready, or until ctx is
// done.
func waitReady(ctx context.Context, conn *grpc.ClientConn, target string) error {
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("connect %s: %w", target, ctx.Err())
		}
	}
	return nil
}

// rlqsRun is what the streams of one rlqs run share: the result, and the
// times to each bucket id's first assignment, both under mu.
type rlqsRun struct {
	c      rlqsConfig
	client rlqsv3.RateLimitQuotaServiceClient
	mu     sync.Mutex
	res    *loadresult.RLQS
	firsts []time.Duration
}

// fail counts an error of kind.
func (r *rlqsRun) fail(kind string) {
	r.mu.Lock()
	r.res.Errors++
	r.res.ErrorKinds[kind]++
	r.mu.Unlock()
}

// stream is stream s of the run, until ctx is done: it reports each of
// its bucket ids alone at once, as Envoy does, then all of them every
// interval.
func (r *rlqsRun) stream(ctx context.Context, s int) {
	c := r.c
	st, err := r.client.StreamRateLimitQuotas(ctx)
	if err != nil {
		r.fail("open")
		return
	}
	ids := make([]*rlqsv3.BucketId, c.buckets)
	sentAt := make(map[string]time.Time, c.buckets)
	for i := range ids {
		key := fmt.Sprintf("%sk%d", c.keyPrefix, s*c.buckets+i)
		ids[i] = &rlqsv3.BucketId{Bucket: map[string]string{"name": rlqsBucket, rlqsKeyEntry: key}}
	}
	// The receiver: answers, and the first assignment of each id.
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		r.receive(ctx, st, sentAt)
	}()
	// As Envoy: each new id reported alone, at once.
	for _, id := range ids {
		r.mu.Lock()
		sentAt[id.Bucket[rlqsKeyEntry]] = time.Now()
		r.mu.Unlock()
		if !r.send(ctx, st, 1, 0, id) {
			return
		}
	}
	tick := time.NewTicker(c.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			st.CloseSend()
			<-recvDone
			return
		case <-tick.C:
			if !r.send(ctx, st, rlqsPerReport, c.interval.Truncate(time.Second), ids...) {
				return
			}
		}
	}
}

// receive counts the answers on st and their actions, and records the
// time to the first assignment of each id in sentAt (sent then), until
// the stream ends.
func (r *rlqsRun) receive(ctx context.Context, st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, sentAt map[string]time.Time) {
	for {
		m, err := st.Recv()
		if err != nil {
			// The run's end: its deadline (gRPC's own timer can
			// fire just before the context's) or the server's
			// answer to the half-close.
			code := status.Code(err)
			if ctx.Err() == nil && !errors.Is(err, io.EOF) && code != codes.DeadlineExceeded && code != codes.Canceled {
				r.fail("recv: " + code.String())
			}
			return
		}
		now := time.Now()
		r.mu.Lock()
		r.res.Answers++
		for _, a := range m.GetBucketAction() {
			r.res.Actions[actionKind(a)]++
			k := a.GetBucketId().GetBucket()[rlqsKeyEntry]
			if t, ok := sentAt[k]; ok {
				r.firsts = append(r.firsts, now.Sub(t))
				delete(sentAt, k)
			}
		}
		r.mu.Unlock()
	}
}

// actionKind names the action of a: abandon, the kind of its rate limit
// strategy, or its blanket rule.
func actionKind(a *rlqsv3.RateLimitQuotaResponse_BucketAction) string {
	kind := "abandon"
	if qa := a.GetQuotaAssignmentAction(); qa != nil {
		switch {
		case qa.GetRateLimitStrategy().GetTokenBucket() != nil:
			kind = "token_bucket"
		case qa.GetRateLimitStrategy().GetRequestsPerTimeUnit() != nil:
			kind = "requests_per_time_unit"
		default:
			kind = qa.GetRateLimitStrategy().GetBlanketRule().String()
		}
	}
	return kind
}

// send reports allowed requests over elapsed for each of ids on st; false
// when the stream failed.
func (r *rlqsRun) send(ctx context.Context, st rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, allowed uint64, elapsed time.Duration, ids ...*rlqsv3.BucketId) bool {
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: rlqsDomain}
	for _, id := range ids {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: id, NumRequestsAllowed: allowed, TimeElapsed: durationpb.New(elapsed)})
	}
	if err := st.Send(m); err != nil {
		if ctx.Err() == nil {
			r.fail("send")
		}
		return false
	}
	r.mu.Lock()
	r.res.Reports++
	r.res.Usages += int64(len(ids))
	r.mu.Unlock()
	return true
}

// finish completes the result of a run that took elapsed: its time and
// the quantiles of the times to a first assignment.
func (r *rlqsRun) finish(elapsed time.Duration) {
	res, firsts := r.res, r.firsts
	res.ElapsedS = elapsed.Seconds()
	slices.Sort(firsts)
	res.FirstAssign = map[string]float64{}
	if n := len(firsts); n > 0 {
		q := func(p float64) float64 { return float64(firsts[min(n-1, int(p*float64(n)))].Microseconds()) }
		res.FirstAssign = map[string]float64{"p50": q(0.5), "p99": q(0.99), "max": q(1), "n": float64(n)}
	}
	if len(res.ErrorKinds) == 0 {
		res.ErrorKinds = nil
	}
}
