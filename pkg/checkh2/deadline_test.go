package checkh2_test

import (
	"context"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/authz"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/checkh2"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/checkwire"
)

// deadlineCheck is the product's handler, which reports the context it
// was given and, when wait is set, waits for that context to end (at
// most 5 s) before it answers.
type deadlineCheck struct {
	*authz.Service
	wait bool
	ctxs chan context.Context
}

func (d deadlineCheck) CheckWire(ctx context.Context, req *checkwire.Request) (checkwire.Response, error) {
	d.ctxs <- ctx
	if d.wait {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
	return d.Service.CheckWire(ctx, req)
}

// The handler's context carries the request's grpc-timeout as its
// deadline, none without one, and ends when the handler returns.
func TestHandlerDeadline(t *testing.T) {
	h := deadlineCheck{Service: newAuthz(t), ctxs: make(chan context.Context, 1)}
	_, addr := serve(t, checkh2.Config{Check: h})
	c := dial(t, addr)

	sent := time.Now()
	c.headers(1, checkPath, false, hpack.HeaderField{Name: "grpc-timeout", Value: "7S"})
	c.fr.WriteData(1, true, grpcMessage(t, upload("d")))
	if _, st := c.response(1); st != "0" {
		t.Fatalf("grpc-status %q", st)
	}
	answered := time.Now()
	ctx := <-h.ctxs
	dl, ok := ctx.Deadline()
	if !ok || dl.Before(sent.Add(7*time.Second)) || dl.After(answered.Add(7*time.Second)) {
		t.Fatalf("deadline %v (set %v), want 7 s after the request, between %v and %v", dl, ok, sent.Add(7*time.Second), answered.Add(7*time.Second))
	}
	if ctx.Err() == nil {
		t.Fatal("the handler's context did not end with its call")
	}

	c.check(3)
	if _, st := c.response(3); st != "0" {
		t.Fatalf("grpc-status %q", st)
	}
	if dl, ok := (<-h.ctxs).Deadline(); ok {
		t.Fatalf("deadline %v without a grpc-timeout", dl)
	}
}

// A deadline that passes while the handler runs is answered
// DEADLINE_EXCEEDED, whatever the handler answers: the handler's context
// ends at it.
func TestDeadlinePassesInHandler(t *testing.T) {
	h := deadlineCheck{Service: newAuthz(t), wait: true, ctxs: make(chan context.Context, 1)}
	_, addr := serve(t, checkh2.Config{Check: h})
	c := dial(t, addr)
	c.headers(1, checkPath, false, hpack.HeaderField{Name: "grpc-timeout", Value: "50m"})
	c.fr.WriteData(1, true, grpcMessage(t, upload("d")))
	if _, st := c.response(1); st != "4" {
		t.Fatalf("grpc-status %q, want 4 (DEADLINE_EXCEEDED)", st)
	}
	if err := (<-h.ctxs).Err(); err != context.DeadlineExceeded {
		t.Fatalf("the handler's context: %v, want DeadlineExceeded", err)
	}
}

// grpc-timeout as the gRPC spec writes it: up to 8 digits and a unit.
// Anything else is answered as grpc-go answers it, HTTP 400 and INTERNAL.
func TestGRPCTimeoutSyntax(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	for _, tc := range []struct {
		value string
		ok    bool
	}{
		{"99999999H", true}, {"1S", true}, {"200m", true}, {"5000000u", true}, {"99999999m", true},
		{"123456789S", false}, {"S", false}, {"5", false}, {"5s", false}, {"+5S", false}, {"-5S", false},
		{" 5S", false}, {"5 S", false}, {"0x5S", false}, {"", true},
	} {
		t.Run(tc.value, func(t *testing.T) {
			c := dial(t, addr)
			var extra []hpack.HeaderField
			if tc.value != "" {
				extra = append(extra, hpack.HeaderField{Name: "grpc-timeout", Value: tc.value})
			}
			c.headers(1, checkPath, false, extra...)
			c.fr.WriteData(1, true, grpcMessage(t, upload("x")))
			h := c.until("the response", func(f http2.Frame) bool {
				_, ok := f.(*http2.MetaHeadersFrame)
				return ok && f.Header().StreamID == 1
			}).(*http2.MetaHeadersFrame)
			status, grpcSt := h.PseudoValue("status"), headerValue(h, "grpc-status")
			switch {
			case tc.ok && (status != "200" || grpcSt != ""):
				t.Fatalf(":status %s grpc-status %q, want a response", status, grpcSt)
			case !tc.ok && (status != "400" || grpcSt != "13"):
				t.Fatalf(":status %s grpc-status %q, want 400 and 13", status, grpcSt)
			}
		})
	}
}
