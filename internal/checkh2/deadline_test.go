package checkh2_test

import (
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// A deadline that passes while the handler runs is answered
// DEADLINE_EXCEEDED, whatever the handler answers, and what the decision
// reserved is given back; one that has not is answered as the handler
// answers.
func TestDeadlinePassesInHandler(t *testing.T) {
	h := &holding{Server: newAuthz(t), pause: 60 * time.Millisecond}
	_, addr := serve(t, checkh2.Config{Check: h})
	c := dial(t, addr)
	c.headers(1, checkPath, false, hpack.HeaderField{Name: "grpc-timeout", Value: "50m"})
	c.fr.WriteData(1, true, grpcMessage(t, upload("d")))
	if _, st := c.response(1); st != "4" {
		t.Fatalf("grpc-status %q, want 4 (DEADLINE_EXCEEDED)", st)
	}
	h.ended(t, 1, 0)
	c.headers(3, checkPath, false, hpack.HeaderField{Name: "grpc-timeout", Value: "30S"})
	c.fr.WriteData(3, true, grpcMessage(t, upload("d")))
	if _, st := c.response(3); st != "0" {
		t.Fatalf("grpc-status %q with 30 s to spare, want 0", st)
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
