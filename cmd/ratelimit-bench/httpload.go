package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/status"
)

// httpCaller sends the example API's requests to Envoy (or any HTTP
// server) over keep-alive HTTP/1.1 connections, one per request in flight.
type httpCaller struct {
	client  *http.Client
	targets []string // base URLs, http://host:port
}

// preparedHTTP is a request ready to send; its header is cloned per call.
type preparedHTTP struct {
	method, path, body string
	header             http.Header
}

func newHTTPCaller(targets []string, concurrency int) (*httpCaller, error) {
	c := &httpCaller{}
	for _, t := range targets {
		base := t
		if !strings.Contains(base, "://") {
			base = "http://" + base
		}
		u, err := url.Parse(base)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("target %q: want host:port or http://host:port", t)
		}
		c.targets = append(c.targets, strings.TrimRight(base, "/"))
	}
	dialer := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}
	c.client = &http.Client{
		Transport: &http.Transport{
			Proxy:               nil, // never a proxy from the environment: loopback only
			DialContext:         dialer.DialContext,
			MaxIdleConns:        concurrency * 2,
			MaxIdleConnsPerHost: concurrency,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return c, nil
}

func (c *httpCaller) prepare(r request, id uint64) (any, error) {
	h := make(http.Header, len(r.headers)+1)
	for k, v := range r.headers {
		h.Set(k, v)
	}
	h.Set("x-request-id", requestID(id))
	return &preparedHTTP{method: r.method, path: r.path, header: h, body: r.body}, nil
}

func (c *httpCaller) call(ctx context.Context, seq uint64, p any) outcome {
	pr := p.(*preparedHTTP)
	var body io.Reader
	if pr.body != "" {
		body = strings.NewReader(pr.body)
	}
	req, err := http.NewRequestWithContext(ctx, pr.method, c.targets[seq%uint64(len(c.targets))]+pr.path, body)
	if err != nil {
		return outcome{class: classError, code: -1, err: err.Error()}
	}
	req.Header = pr.header.Clone()
	resp, err := c.client.Do(req)
	if err != nil {
		return outcome{class: classError, code: -1, err: errKind(err)}
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return outcome{class: classError, code: -1, err: errKind(err)}
	}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return outcome{class: classAllowed, code: resp.StatusCode}
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusForbidden:
		return outcome{class: classDenied, code: resp.StatusCode}
	}
	return outcome{class: classError, code: resp.StatusCode, err: "HTTP " + resp.Status}
}

// errKind names a failed call for the error breakdown: a gRPC status by
// its code and message, a transport failure by its cause.
func errKind(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Code().String() + ": " + clip(s.Message())
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed by the server"
	}
	return clip(err.Error())
}

// clip shortens an error message to what an error breakdown can show.
func clip(msg string) string {
	if len(msg) > 120 {
		return msg[:120] + "…"
	}
	return msg
}

func (c *httpCaller) close() { c.client.CloseIdleConnections() }
