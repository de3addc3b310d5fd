package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
)

const (
	defaultProbeURL     = "http://127.0.0.1:9090/readyz"
	defaultProbeTimeout = 2 * time.Second
	// maxProbeTimeout bounds --timeout: a health check that may hang for
	// longer than this holds the container runtime's check slot for
	// nothing.
	maxProbeTimeout = time.Minute
	// maxProbeBody is the most of the response read: /readyz answers a
	// line or two, and the reason printed quotes its first line only.
	maxProbeBody = 4 << 10
	// maxProbeReason bounds the quoted body in a failure's reason.
	maxProbeReason = 200
)

// runProbe is `probe`: one GET of a readiness URL, for a container image
// without a shell or curl. Exit 0 on 200; 1 on anything else, a usage
// error included (Docker reserves a health check's exit status 2).
func runProbe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f := newEnvFlags("probe", "GET a readiness URL once (a container health check): exit 0 when it answers 200,\n"+
		"1 otherwise with the reason on stderr. Redirects are not followed; proxies\n"+
		"from the environment are not used.", getenv)
	var rawURL string
	var timeout time.Duration
	f.String(&rawURL, "url", "RATELIMIT_AUTHZ_PROBE_URL", defaultProbeURL, "`URL` to GET (http or https; the node's /readyz on its --http-addr)")
	f.Duration(&timeout, "timeout", "RATELIMIT_AUTHZ_PROBE_TIMEOUT", defaultProbeTimeout,
		fmt.Sprintf("longest wait for the whole answer, connection included (at most %s)", maxProbeTimeout))
	done, err := cli.Parse(f.fs, args, stdout, stderr)
	if done {
		if err != nil {
			return exitError{code: 1}
		}
		return nil
	}
	if err := errors.Join(f.errs...); err != nil {
		return probeFailed("%v", err)
	}
	u, err := probeTarget(rawURL, timeout)
	if err != nil {
		return probeFailed("%v", err)
	}
	status, line, err := probe(ctx, u, timeout)
	if err != nil {
		return probeFailed("GET %s: %v", u.Redacted(), err)
	}
	if status != http.StatusOK {
		return probeFailed("GET %s: %s", u.Redacted(), line)
	}
	fmt.Fprintf(stdout, "%s: %s\n", u.Redacted(), line)
	return nil
}

// probeFailed is the one-line reason of a failed probe, exit status 1.
func probeFailed(format string, args ...any) error {
	return exitError{code: 1, msg: "ratelimit-authz probe: " + fmt.Sprintf(format, args...)}
}

// probeTarget validates the URL and the timeout: an absolute http or https
// URL with a host, and a timeout in (0, maxProbeTimeout].
func probeTarget(raw string, timeout time.Duration) (*url.URL, error) {
	if timeout <= 0 || timeout > maxProbeTimeout {
		return nil, fmt.Errorf("timeout %v: want more than 0 and at most %v", timeout, maxProbeTimeout)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("URL %q: %w", raw, errors.Unwrap(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("URL %q: the scheme must be http or https", u.Redacted())
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("URL %q: no host", u.Redacted())
	}
	return u, nil
}

// probe GETs u once within timeout and returns the status code and a line
// describing the answer: the status and, quoted, the first line of at
// most maxProbeBody bytes of body. A redirect is returned as it came,
// never followed (its target may be another host).
func probe(ctx context.Context, u *url.URL, timeout time.Duration) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{
		Transport: &http.Transport{
			Proxy:                  nil, // a probe of this node never goes through HTTP(S)_PROXY
			DialContext:            (&net.Dialer{}).DialContext,
			TLSClientConfig:        &tls.Config{MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout:    timeout,
			DisableKeepAlives:      true,
			MaxResponseHeaderBytes: 16 << 10,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("User-Agent", "ratelimit-authz-probe/"+version)
	resp, err := client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return 0, "", fmt.Errorf("no answer within %v", timeout)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is already in the caller's message
		}
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	if err != nil {
		// A status without its body (a stalled or cut answer) is no
		// evidence of a healthy node.
		return 0, "", fmt.Errorf("%s, then reading the body: %w", resp.Status, err)
	}
	return resp.StatusCode, describe(resp.Status, resp.StatusCode, resp.Header.Get("Location"), body), nil
}

// describe is the one line that tells what answered: the status, a
// redirect's target and the first line of the body, the far end's text
// quoted and clipped so that it can neither add lines nor grow the reason
// without bound.
func describe(status string, code int, location string, body []byte) string {
	line := fmt.Sprintf("%q", clip(status))
	if st := fmt.Sprintf("%d %s", code, http.StatusText(code)); status == st {
		line = status
	}
	if code >= 300 && code < 400 {
		line += fmt.Sprintf(" (a redirect to %q, not followed)", clip(location))
	}
	if first, _, _ := bytes.Cut(body, []byte("\n")); len(bytes.TrimSpace(first)) > 0 {
		line += fmt.Sprintf(" %q", clip(string(bytes.TrimSpace(first))))
	}
	return line
}

// clip shortens s to maxProbeReason bytes for a one-line reason; %q then
// escapes whatever control bytes it holds.
func clip(s string) string {
	if len(s) <= maxProbeReason {
		return s
	}
	return strings.ToValidUTF8(s[:maxProbeReason], "") + "…"
}
