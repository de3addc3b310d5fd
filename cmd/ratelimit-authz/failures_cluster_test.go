package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// Failed logins counted on one node lock the account on the others: the
// failure counters replicate like any other.
func TestServeClusterSharesFailures(t *testing.T) {
	srv := testnats.Run(t)
	token := map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN": "t0ken"}
	a := startNode(t, "a", "../../config/ratelimit.yaml", srv.ClientURL(), token)
	b := startNode(t, "b", "../../config/ratelimit.yaml", srv.ClientURL(), token)
	a.waitReady(t)
	b.waitReady(t)

	login := func(n *servedNode, ip, account string) bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := n.client.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "POST", Path: "/admin/login",
				Headers: map[string]string{"x-login-account": account, "x-envoy-external-address": ip},
			}},
		}})
		if err != nil {
			t.Fatalf("%s: Check: %v", n.id, err)
		}
		return resp.GetStatus().GetCode() == int32(codes.OK)
	}
	// Stay away from a minute boundary: the login windows are a minute.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 10*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
	if !login(b, "198.51.100.1", "carol@example.com") {
		t.Fatal("b: login denied before any failure")
	}
	for i := 0; i < 5; i++ {
		req, _ := http.NewRequest("POST", "http://"+a.http+"/v1/failures", strings.NewReader(`{"ip":"203.0.113.30","account":"carol@example.com"}`))
		req.Header.Set("Authorization", "Bearer t0ken")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("a: failure report %d: %d", i+1, resp.StatusCode)
		}
	}
	reported := time.Now()
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if login(b, "198.51.100.1", "carol@example.com") {
			return errors.New("b still admits the account locked on a")
		}
		return nil
	})
	t.Logf("b saw the lockout %v after a counted the fifth failure (sync interval 50ms)", time.Since(reported).Round(time.Millisecond))
	// The IP is locked on b too, for any account.
	if login(b, "203.0.113.30", "dave@example.com") {
		t.Error("b admits the IP locked on a")
	}
	if !login(b, "198.51.100.2", "dave@example.com") {
		t.Error("b denies an unrelated IP and account")
	}
}
