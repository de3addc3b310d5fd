package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// TestServe: the app answers as the compose stack expects (200, and 401
// for a login without the password), and stops when its context ends.
func TestServe(t *testing.T) {
	addr := freeport.TestAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, addr) }()
	c := &http.Client{Timeout: 5 * time.Second}
	var status int
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		resp, err := c.Get("http://" + addr + "/api/activities")
		if err != nil {
			return err
		}
		resp.Body.Close()
		status = resp.StatusCode
		return nil
	})
	if status != http.StatusOK {
		t.Errorf("GET /api/activities: %d, want 200", status)
	}
	resp, err := c.Post("http://"+addr+"/admin/login", "application/x-www-form-urlencoded", strings.NewReader("email=a@example.com&password=wrong"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("login with a wrong password: %d, want 401", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop within 10 s of its context ending")
	}
}
