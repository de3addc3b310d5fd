package checkh2_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/checkh2"
)

// seedFrames is a client's frames after the preface: SETTINGS, a Check
// and a health check, a ping, a reset and a window update.
func seedFrames(t testing.TB) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	hdr := func(id uint32, path string, end bool) {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
			{Name: ":authority", Value: "a"}, {Name: "content-type", Value: "application/grpc"}, {Name: "grpc-timeout", Value: "5S"},
		} {
			enc.WriteField(f)
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: end})
	}
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10})
	hdr(1, checkPath, false)
	fr.WriteData(1, true, grpcMessage(t, upload("f")))
	hdr(3, "/grpc.health.v1.Health/Check", false)
	fr.WriteData(3, true, []byte{0, 0, 0, 0, 0})
	fr.WritePing(false, [8]byte{1})
	hdr(5, checkPath, false)
	fr.WriteRSTStream(5, http2.ErrCodeCancel)
	fr.WriteWindowUpdate(1, 100)
	fr.WriteWindowUpdate(0, 100)
	fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	return b.Bytes()
}

// FuzzServe feeds a connection the preface and then any bytes: the server
// must neither panic nor hang (every wait is bounded by its timeouts).
func FuzzServe(f *testing.F) {
	f.Add(seedFrames(f))
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	s, err := checkh2.New(checkh2.Config{
		Check: newAuthz(f), MaxRecvMsgBytes: 4 << 10, MaxHeaderListBytes: 4 << 10, MaxConcurrentStreams: 8,
		HandshakeTimeout: time.Second, IdleTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond,
		WriteTimeout: time.Second,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close)
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		client.SetDeadline(time.Now().Add(10 * time.Second))
		s.ServeConn(server)
		go io.Copy(io.Discard, client)
		client.Write([]byte(http2.ClientPreface))
		client.Write(in)
		client.Close()
		// The connection's goroutine ends once its peer is gone: nothing
		// it does waits past its timeouts.
		for end := time.Now().Add(5 * time.Second); s.Open() > 0; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the connection was still served 5 s after its peer closed")
			}
		}
	})
}
