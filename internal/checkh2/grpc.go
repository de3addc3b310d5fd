package checkh2

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// The methods served.
const (
	pathCheck     = authv3.Authorization_Check_FullMethodName
	pathRateLimit = rlsv3.RateLimitService_ShouldRateLimit_FullMethodName
	pathHealth    = healthpb.Health_Check_FullMethodName
)

type method uint8

const (
	methodUnknown method = iota
	methodCheck
	methodRateLimit
	methodHealth
)

func methodOf(path string) method {
	switch path {
	case pathCheck:
		return methodCheck
	case pathRateLimit:
		return methodRateLimit
	case pathHealth:
		return methodHealth
	}
	return methodUnknown
}

// grpcStatus is a gRPC status for the trailers.
type grpcStatus struct {
	code codes.Code
	msg  string
}

func errorf(code codes.Code, format string, args ...any) grpcStatus {
	return grpcStatus{code: code, msg: fmt.Sprintf(format, args...)}
}

// maxStatusMessage bounds grpc-message (before percent-encoding), so the
// trailers always fit one frame of the smallest size a peer may set.
const maxStatusMessage = 1 << 10

// appendPercentEncoded appends msg as grpc-message carries it: bytes
// outside printable ASCII, and '%', as %XX.
func appendPercentEncoded(b []byte, msg string) []byte {
	if len(msg) > maxStatusMessage {
		msg = msg[:maxStatusMessage]
	}
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c >= ' ' && c <= '~' && c != '%' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&15])
	}
	return b
}

func codeText(c codes.Code) string { return strconv.FormatUint(uint64(c), 10) }

// parseTimeout parses a grpc-timeout value: at most 8 digits and a unit.
func parseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	var n int64
	for _, c := range v[:len(v)-1] {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if unit == time.Hour && n > int64(1<<63-1)/int64(time.Hour) {
		return 1<<63 - 1, true
	}
	return time.Duration(n) * unit, true
}

// message checks a unary request body, the one gRPC message: an
// uncompressed prefix whose length is what follows. It returns the
// message, or the status grpc-go answers for that body.
func message(body []byte, maxBytes int) ([]byte, grpcStatus, bool) {
	if len(body) < 5 {
		return nil, errorf(codes.Internal, "grpc: received an incomplete message of %d bytes", len(body)), false
	}
	if body[0] != 0 {
		return nil, errorf(codes.Internal, "grpc: compressed flag set with identity or empty encoding"), false
	}
	n := binary.BigEndian.Uint32(body[1:5])
	if uint64(n) > uint64(maxBytes) {
		return nil, errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, maxBytes), false
	}
	if int(n) != len(body)-5 {
		return nil, errorf(codes.Internal, "grpc: a unary request of %d bytes after a message of %d", len(body)-5, n), false
	}
	return body[5:], grpcStatus{}, true
}

// healthAnswers are the health responses, encoded once.
type healthAnswers struct {
	serving, notServing []byte // gRPC messages, prefix included
}

func newHealthAnswers() (healthAnswers, error) {
	enc := func(st healthpb.HealthCheckResponse_ServingStatus) ([]byte, error) {
		b, err := proto.Marshal(&healthpb.HealthCheckResponse{Status: st})
		if err != nil {
			return nil, fmt.Errorf("checkh2: encode a health response: %w", err)
		}
		return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...), nil
	}
	var h healthAnswers
	var err error
	if h.serving, err = enc(healthpb.HealthCheckResponse_SERVING); err != nil {
		return h, err
	}
	h.notServing, err = enc(healthpb.HealthCheckResponse_NOT_SERVING)
	return h, err
}

// healthKnows answers for the server (""), the Authorization service and
// the rate limit service when it is served, as the gRPC port does; any
// other name is NOT_FOUND.
func (s *Server) healthKnows(service string) bool {
	return service == "" || service == authv3.Authorization_ServiceDesc.ServiceName ||
		(s.cfg.RateLimit != nil && service == rlsv3.RateLimitService_ServiceDesc.ServiceName)
}

// decodeHealth reads the service name of a HealthCheckRequest.
func decodeHealth(msg []byte) (string, error) {
	var req healthpb.HealthCheckRequest
	if err := proto.Unmarshal(msg, &req); err != nil {
		return "", err
	}
	return req.Service, nil
}
