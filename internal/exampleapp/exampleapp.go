// Package exampleapp is the application behind Envoy in the end-to-end
// tests and the demo: a stand-in for the example API of
// envoy/ratelimit-authz.yaml that answers every request 200 with a small
// JSON body — except a login (a path ending in /login) without the right
// password, which gets 401, the failure Envoy's access log reports to the
// server — and counts, per path, the requests that reached it. A
// completion (a path ending in /llm/completions) reports the tokens it
// used in UsageHeader, as LLM APIs do: the request's TokensHeader, or
// DefaultTokens; the token budget charges it from Envoy's access log.
package exampleapp

import (
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// Password is the only password a login accepts.
const Password = "right"

const (
	// UsageHeader is the response header a completion reports its tokens in.
	UsageHeader = "x-usage-total-tokens"
	// TokensHeader is the request header that says how many tokens a
	// completion uses (a test's stand-in for a prompt).
	TokensHeader = "x-example-tokens"
	// DefaultTokens is what a completion uses without TokensHeader.
	DefaultTokens = "1000"
)

// maxBody bounds what a request body is read to.
const maxBody = 1 << 20

// App is the HTTP handler. It is safe for concurrent use; the zero value
// is not usable, use New.
type App struct {
	mu   sync.Mutex
	hits map[string]int
}

// New returns an App that has seen no request.
func New() *App { return &App{hits: map[string]int{}} }

// ServeHTTP counts the request under its path and answers it.
func (a *App) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, maxBody))
	a.mu.Lock()
	a.hits[r.URL.Path]++
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.HasSuffix(r.URL.Path, "/llm/completions") {
		tokens := r.Header.Get(TokensHeader)
		if tokens == "" {
			tokens = DefaultTokens
		}
		w.Header().Set(UsageHeader, tokens)
	}
	if strings.HasSuffix(r.URL.Path, "/login") && password(r.Header.Get("Content-Type"), body) != Password {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"error":"bad credentials"}`)
		return
	}
	io.WriteString(w, `{"ok":true}`)
}

// password is the "password" field of a JSON or form body, or "".
func password(contentType string, body []byte) string {
	mt, _, _ := mime.ParseMediaType(contentType)
	if mt == "application/x-www-form-urlencoded" {
		v, err := url.ParseQuery(string(body))
		if err != nil {
			return ""
		}
		return v.Get("password")
	}
	var login struct {
		Password string `json:"password"`
	}
	if json.Unmarshal(body, &login) != nil {
		return ""
	}
	return login.Password
}

// Hits returns how many requests to path reached the app.
func (a *App) Hits(path string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.hits[path]
}

// Reset forgets every request seen so far.
func (a *App) Reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.hits)
}
