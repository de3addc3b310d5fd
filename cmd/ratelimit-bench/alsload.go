package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// extAuthzNamespace is where Envoy files the Check's dynamic metadata in
// an access-log entry; chargesField is the metadata field that names the
// keys to charge after the response.
const (
	extAuthzNamespace = "envoy.filters.http.ext_authz"
	chargesField      = "charges"
)

// alsCharge is what each entry of the accesslog load charges: bucket
// (a cost bucket charged from the response header header) for the
// request's tenant, the header reporting cost.
type alsCharge struct {
	bucket, header string
	cost           int64
}

// alsEntry is the access-log entry Envoy sends for r once its response is
// known, with the shipped bootstrap's common properties, the Check's
// charges metadata (bucket → the request's tenant) and the logged
// response header reporting c.cost. The preflight probe (no tenant) gets
// no charges: the server ignores its entry.
func alsEntry(r request, id uint64, c alsCharge, now time.Time) *accesslogv3.HTTPAccessLogEntry {
	e := &accesslogv3.HTTPAccessLogEntry{
		CommonProperties: &accesslogv3.AccessLogCommon{
			DownstreamRemoteAddress:    socketAddress(r.clientIP, uint32(32768+id%28000)),
			DownstreamLocalAddress:     socketAddress(envoyListener, 10000),
			StartTime:                  timestamppb.New(now),
			TimeToLastRxByte:           durationpb.New(50 * time.Microsecond),
			TimeToLastDownstreamTxByte: durationpb.New(2 * time.Millisecond),
			UpstreamRemoteAddress:      socketAddress("127.0.0.1", 8080),
			UpstreamCluster:            "app",
			RouteName:                  r.route,
		},
		ProtocolVersion: accesslogv3.HTTPAccessLogEntry_HTTP11,
		Request: &accesslogv3.HTTPRequestProperties{
			RequestMethod:       corev3.RequestMethod(corev3.RequestMethod_value[r.method]),
			Scheme:              "http",
			Authority:           "api.example.com",
			Path:                r.path,
			RequestId:           requestID(id),
			RequestHeadersBytes: 400,
			RequestBodyBytes:    uint64(len(r.body)),
		},
		Response: &accesslogv3.HTTPResponseProperties{
			ResponseCode:         wrapperspb.UInt32(200),
			ResponseHeadersBytes: 200,
			ResponseBodyBytes:    512,
			ResponseHeaders:      map[string]string{c.header: strconv.FormatInt(c.cost, 10)},
			ResponseCodeDetails:  "via_upstream",
		},
	}
	if tenant := r.headers["x-tenant-id"]; tenant != "" {
		charges := &structpb.Struct{Fields: map[string]*structpb.Value{c.bucket: structpb.NewStringValue(tenant)}}
		e.CommonProperties.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			extAuthzNamespace: {Fields: map[string]*structpb.Value{chargesField: structpb.NewStructValue(charges)}},
		}}
	}
	return e
}

// alsLoad is StreamAccessLogs, each entry charging c. Every route of m
// must carry a tenant: the entry charges the bucket to it.
func alsLoad(c alsCharge, m mix) (grpcLoad, error) {
	if c.bucket == "" || c.header == "" || c.cost < 0 {
		return grpcLoad{}, fmt.Errorf("--bucket and --cost-header must be set and --cost not negative")
	}
	for _, r := range m.routes {
		if !r.tenant {
			return grpcLoad{}, fmt.Errorf("--routes: route %s has no tenant to charge (use routes with x-tenant-id)", r.name)
		}
	}
	return grpcLoad{method: "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs", stream: true,
		encode: func(r request, id uint64) ([]byte, error) {
			return proto.Marshal(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
				HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogv3.HTTPAccessLogEntry{alsEntry(r, id, c, time.Now())}},
			}})
		}}, nil
}

// streamCaller sends a client-streaming load as Envoy's gRPC access
// logger does: one message per entry (buffer_size_bytes: 0) on one stream
// per connection. A call is one message sent: it is "allowed" once the
// transport takes it, as the service answers only when a stream ends;
// drain ends the streams and reports any the server did not close
// cleanly.
type streamCaller struct {
	*grpcCaller
	streams []stream
}

// stream is one connection's stream, opened on first use and again after
// a failure; mu serialises its sends, as a stream allows one sender.
type stream struct {
	mu     sync.Mutex
	cs     grpc.ClientStream
	cancel context.CancelFunc
}

// call sends p on its connection's stream. A send that outlasts ctx (the
// server stopped reading) ends the stream, so that no worker hangs.
func (c *streamCaller) call(ctx context.Context, seq uint64, p any) outcome {
	i := seq % uint64(len(c.streams))
	s := &c.streams[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cs == nil {
		sctx, cancel := context.WithCancel(context.Background())
		cs, err := c.conns[i].NewStream(sctx, &grpc.StreamDesc{ClientStreams: true}, c.method)
		if err != nil {
			cancel()
			return outcome{class: classError, code: -1, err: errKind(err)}
		}
		s.cs, s.cancel = cs, cancel
	}
	stop := context.AfterFunc(ctx, s.cancel)
	err := s.cs.SendMsg(p)
	stop()
	if err != nil {
		if errors.Is(err, io.EOF) { // the stream ended: RecvMsg has why
			err = s.cs.RecvMsg(&reply{})
		}
		s.cancel()
		s.cs = nil
		return outcome{class: classError, code: -1, err: "send: " + errKind(err)}
	}
	return outcome{class: classAllowed}
}

// drain half-closes every open stream and waits, until ctx ends, for the
// server's answer: once it came, the server has taken every message sent
// on that stream.
func (c *streamCaller) drain(ctx context.Context) error {
	var errs []error
	for i := range c.streams {
		s := &c.streams[i]
		s.mu.Lock()
		if s.cs != nil {
			stop := context.AfterFunc(ctx, s.cancel)
			err := s.cs.CloseSend()
			if err == nil {
				err = s.cs.RecvMsg(&reply{})
			}
			stop()
			s.cancel()
			s.cs = nil
			if err != nil {
				errs = append(errs, errors.New(errKind(err)))
			}
		}
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// close cancels the streams still open, then closes the connections.
func (c *streamCaller) close() {
	for i := range c.streams {
		s := &c.streams[i]
		s.mu.Lock()
		if s.cancel != nil {
			s.cancel()
		}
		s.mu.Unlock()
	}
	c.grpcCaller.close()
}
