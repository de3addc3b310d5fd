package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// liveView prints, from the server's admin listener, each bucket's most
// limited key over the last minute, and where the same view is while a
// node runs: the status page and `ratelimit-authz top`.
func (d *demo) liveView(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.adminAddr+"/v1/top?n=1", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("the live view: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the live view: GET /v1/top: %s", resp.Status)
	}
	var tops admin.TopResponse
	if err := json.NewDecoder(resp.Body).Decode(&tops); err != nil {
		return fmt.Errorf("the live view: %w", err)
	}
	d.out.linef("")
	d.out.linef("who was limited (the live view, http://%s/, the last minute):", d.adminAddr)
	for _, b := range tops.Buckets {
		m := b.Minute
		if m.Denied == 0 || len(m.TopDenied) == 0 {
			continue
		}
		k := m.TopDenied[0]
		d.out.linef("  %-16s %q denied %d of its %d denials (%s/s)", b.Bucket, k.Key, k.Hits, m.Denied, top.Rate(m.Denied, m.End.Sub(m.Start).Seconds()))
	}
	d.out.linef("")
	d.out.linef("While a node runs (make run), the same view is at http://127.0.0.1:9095/ and in `ratelimit-authz top`.")
	return nil
}

// stayUp prints what to try against the running stack and waits for
// ctx (Ctrl-C); it returns errInterrupted-free nil then: staying up and
// being stopped is the plan.
func (d *demo) stayUp(ctx context.Context) error {
	d.out.linef("")
	d.out.linef("The stack stays up until Ctrl-C. Try:")
	d.out.linef("  curl -si -XPOST -H 'x-tenant-id: acme' http://%s/api/activities      # 200, RateLimit-Policy", d.addrs.Listener)
	d.out.linef("  for i in $(seq 120); do curl -so /dev/null -w '%%{http_code} ' -XPOST -H 'x-tenant-id: acme' http://%s/api/activities; done   # 429s past 100/s", d.addrs.Listener)
	d.out.linef("  open http://%s/                                   # the live view: who is limited", d.adminAddr)
	d.out.linef("  ratelimit-authz top --admin-addr %s               # the same, in the terminal", d.adminAddr)
	d.out.linef("  curl -s http://%s/metrics | grep ratelimit_authz_checks_total", d.httpAddr)
	<-ctx.Done()
	return nil
}
