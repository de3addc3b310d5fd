package exampleapp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestApp(t *testing.T) {
	app := New()
	for _, tc := range []struct {
		path, contentType, body string
		want                    int
	}{
		{"/api/activities", "application/json", `{}`, 200},
		{"/api/activities", "", ``, 200},
		{"/admin/login", "application/json", `{"email":"a@x","password":"wrong"}`, 401},
		{"/admin/login", "application/json", `{"email":"a@x","password":"right"}`, 200},
		{"/portal/login", "application/x-www-form-urlencoded", `email=a%40x&password=right`, 200},
		{"/portal/login", "application/x-www-form-urlencoded", `email=a%40x&password=Right`, 401},
		{"/portal/login", "application/json", `{"email":"a@x","password":"right"`, 401}, // truncated
		{"/portal/login", "", ``, 401},
	} {
		req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
		if tc.contentType != "" {
			req.Header.Set("Content-Type", tc.contentType)
		}
		rec := httptest.NewRecorder()
		app.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("POST %s %s: %d, want %d", tc.path, tc.body, rec.Code, tc.want)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("content-type %q", ct)
		}
	}
	if n := app.Hits("/api/activities"); n != 2 {
		t.Errorf("Hits(/api/activities) = %d, want 2", n)
	}
	if n := app.Hits("/portal/login"); n != 4 {
		t.Errorf("Hits(/portal/login) = %d, want 4", n)
	}
	app.Reset()
	if n := app.Hits("/portal/login"); n != 0 {
		t.Errorf("after Reset: %d", n)
	}
}

func TestCompletionReportsTokens(t *testing.T) {
	app := New()
	for tokens, want := range map[string]string{"": DefaultTokens, "250": "250"} {
		req := httptest.NewRequest(http.MethodPost, "/api/llm/completions", strings.NewReader(`{}`))
		if tokens != "" {
			req.Header.Set(TokensHeader, tokens)
		}
		rec := httptest.NewRecorder()
		app.ServeHTTP(rec, req)
		if got := rec.Header().Get(UsageHeader); rec.Code != 200 || got != want {
			t.Errorf("tokens %q: %d, %s %q, want %q", tokens, rec.Code, UsageHeader, got, want)
		}
	}
	rec := httptest.NewRecorder()
	app.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/activities", nil))
	if got := rec.Header().Get(UsageHeader); got != "" {
		t.Errorf("an activity reports tokens %q", got)
	}
}
