package main

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"
	"unicode"
)

// --help and usage errors print every flag's default, and an environment
// variable's value becomes the default: a password in it is shown hidden.
func TestHelpHidesPasswords(t *testing.T) {
	vars := map[string]string{
		"DATABASE_URL": "postgres://limits:pw-SECRET1@db.internal/limits",
		"NATS_URL":     "nats://a:pw-SECRET2@n1:4222, nats://b:pw-SECRET3@n2:4222",
	}
	for _, args := range [][]string{{"serve", "--help"}, {"serve", "--bogus"}, {"limits", "list", "--help"}, {"migrate", "--bogus"}} {
		var out, errOut bytes.Buffer
		run(context.Background(), args, env(vars), &out, &errOut)
		all := out.String() + errOut.String()
		if strings.Contains(all, "SECRET") {
			t.Errorf("%v shows a password:\n%s", args, all)
		}
		if !strings.Contains(all, "DATABASE_URL") {
			t.Errorf("%v: no usage printed:\n%s", args, all)
		}
	}
}

func TestRedactPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:pw@h:5432/db?sslmode=require":         "postgres://u:xxxxx@h:5432/db?sslmode=require",
		"postgres://u@h/db":                                 "postgres://u@h/db",
		"postgres://h/db?user=u&password=pw&sslmode=verify": "postgres://h/db?user=u&password=xxxxx",
		"host=h user=u password=pw dbname=d":                "host=h user=u password=xxxxx dbname=d",
		`host=h password='p w \' x' dbname=d`:               "host=h password=xxxxx dbname=d",
		"nats://a:1@n1,nats://b:2@n2":                       "nats://a:xxxxx@n1,nats://b:xxxxx@n2",
		"127.0.0.1:9001":                                    "127.0.0.1:9001",
		"config/ratelimit.yaml":                             "config/ratelimit.yaml",
	} {
		if got := redactPasswords(in); got != want {
			t.Errorf("redactPasswords(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzRedactPasswords: whatever the password, its URL form (as url
// encodes it) and its keyword/value form never survive redaction.
func FuzzRedactPasswords(f *testing.F) {
	for _, s := range []string{"hunter22", "p@ss:w/rd", "with space", "ünïcode", "a,b,c", "'quoted'", `back\slash`, "%41%42"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if len(pw) < 4 {
			return
		}
		u := (&url.URL{Scheme: "postgres", User: url.UserPassword("limits", pw), Host: "db.internal", Path: "/limits"}).String()
		enc := strings.TrimSuffix(strings.TrimPrefix(u, "postgres://limits:"), "@db.internal/limits")
		if out := redactPasswords(u); strings.Contains(out, enc) && !strings.Contains("postgres://limits:xxxxx@db.internal/limits", enc) {
			t.Fatalf("%q: redacted to %q", u, out)
		}
		if strings.ContainsFunc(pw, func(r rune) bool { return unicode.IsSpace(r) || r == '\'' || r == '\\' }) {
			return // a keyword/value password with these is written quoted (below)
		}
		for _, dsn := range []string{"host=h password=" + pw + " user=u", "host=h password='" + pw + "' user=u"} {
			if out := redactPasswords(dsn); strings.Contains(out, pw) && !strings.Contains("host=h password=xxxxx user=u", pw) {
				t.Fatalf("%q: redacted to %q", dsn, out)
			}
		}
	})
}

func TestParseSecret(t *testing.T) {
	for in, want := range map[string]string{
		"tok":       "tok",
		"tok\n":     "tok",
		"tok\r\n\n": "tok",
		" tok \n":   " tok ",
		"a\nb\n":    "a\nb",
	} {
		if got, err := parseSecret([]byte(in)); err != nil || got != want {
			t.Errorf("parseSecret(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "\n", "\r\n\r\n", strings.Repeat("x", maxSecretFileBytes+1)} {
		if _, err := parseSecret([]byte(in)); err == nil {
			t.Errorf("parseSecret(%.20q…) accepted", in)
		}
	}
}

// FuzzParseSecret: a secret file yields its content without trailing line
// ends, never empty, never over the bound.
func FuzzParseSecret(f *testing.F) {
	for _, s := range []string{"t0ken\n", "", "\r\n", "a\x00b", strings.Repeat("x", 100)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseSecret(b)
		if err != nil {
			if len(b) <= maxSecretFileBytes && strings.Trim(string(b), "\r\n") != "" {
				t.Fatalf("%q refused: %v", b, err)
			}
			return
		}
		if s == "" || len(s) > maxSecretFileBytes || strings.HasSuffix(s, "\n") || strings.HasSuffix(s, "\r") || !strings.HasPrefix(string(b), s) {
			t.Fatalf("%q gave %q", b, s)
		}
	})
}
