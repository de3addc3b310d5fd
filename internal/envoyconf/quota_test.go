package envoyconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
)

// shippedQuota is envoy/ratelimit-quota.yaml, rendered with test
// addresses.
func shippedQuota(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", QuotaPath))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Render(b, Addrs{Admin: "127.0.0.1:41000", Listener: "127.0.0.1:42000", App: "127.0.0.1:43000", Authz: []string{"127.0.0.1:40001"}})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// quotaBootstrap is the part of a quota bootstrap the tests look at.
type quotaBootstrap struct {
	StaticResources struct {
		Listeners []struct {
			FilterChains []struct {
				Filters []struct {
					TypedConfig struct {
						HTTPFilters []struct {
							Name        string
							TypedConfig struct {
								Domain         string
								BucketMatchers struct {
									MatcherList struct {
										Matchers []struct {
											Predicate struct {
												SinglePredicate struct {
													Input struct {
														TypedConfig struct {
															HeaderName string `yaml:"header_name"`
														} `yaml:"typed_config"`
													}
													ValueMatch map[string]string `yaml:"value_match"`
												} `yaml:"single_predicate"`
											}
											OnMatch struct {
												Action struct {
													TypedConfig struct {
														BucketIDBuilder struct {
															BucketIDBuilder map[string]struct {
																StringValue string `yaml:"string_value"`
																CustomValue struct {
																	TypedConfig struct {
																		HeaderName string `yaml:"header_name"`
																	} `yaml:"typed_config"`
																} `yaml:"custom_value"`
															} `yaml:"bucket_id_builder"`
														} `yaml:"bucket_id_builder"`
														DenyResponseSettings struct {
															ResponseHeadersToAdd []struct {
																Header struct{ Key, Value string }
															} `yaml:"response_headers_to_add"`
														} `yaml:"deny_response_settings"`
													} `yaml:"typed_config"`
												}
											} `yaml:"on_match"`
										}
									} `yaml:"matcher_list"`
								} `yaml:"bucket_matchers"`
							} `yaml:"typed_config"`
						} `yaml:"http_filters"`
					} `yaml:"typed_config"`
				}
			} `yaml:"filter_chains"`
		}
	} `yaml:"static_resources"`
}

func allQuotaOptions() []QuotaBucket {
	return []QuotaBucket{
		{Header: "x-case", Exact: "a", ID: []QuotaIDPart{{Key: "name", Value: "a"}, {Key: "tenant", Header: "x-tenant-id"}},
			ReportingInterval: 2 * time.Second, NoAssignment: &QuotaStrategy{Blanket: "DENY_ALL"},
			Expired: &QuotaStrategy{MaxTokens: 5, TokensPerFill: 5, FillInterval: time.Second}, ExpiredTimeout: time.Minute,
			DenyStatus: 429, DenyBody: `{"error":"rate_limited"}`, DenyHeaders: map[string]string{"retry-after": "1"}},
		{Header: ":path", Prefix: "/api/", ID: []QuotaIDPart{{Key: "name", Value: "b"}}, ReuseLast: true,
			NoAssignment: &QuotaStrategy{PerUnit: 10, Unit: "SECOND"}},
	}
}

// TestQuotaBootstrapValidates: the shipped quota bootstrap, rendered and
// with every option WithQuotaBuckets writes, loads in the pinned Envoy.
func TestQuotaBootstrapValidates(t *testing.T) {
	envoy := binaries.InstalledEnvoy(t)
	dir := t.TempDir()
	shipped := filepath.Join(dir, "shipped.yaml")
	if err := os.WriteFile(shipped, shippedQuota(t), 0o644); err != nil {
		t.Fatal(err)
	}
	validate(t, envoy, shipped)
	out, err := WithQuotaBuckets(shippedQuota(t), "stub", allQuotaOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	edited := filepath.Join(dir, "edited.yaml")
	if err := os.WriteFile(edited, out, 0o644); err != nil {
		t.Fatal(err)
	}
	validate(t, envoy, edited)
}

func TestWithQuotaBuckets(t *testing.T) {
	out, err := WithQuotaBuckets(shippedQuota(t), "stub", allQuotaOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	var b quotaBootstrap
	if err := yaml.Unmarshal(out, &b); err != nil {
		t.Fatal(err)
	}
	f := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig.HTTPFilters[1]
	if f.Name != "envoy.filters.http.rate_limit_quota" || f.TypedConfig.Domain != "stub" {
		t.Fatalf("filter %q domain %q, want the quota filter with domain stub", f.Name, f.TypedConfig.Domain)
	}
	ms := f.TypedConfig.BucketMatchers.MatcherList.Matchers
	if len(ms) != 2 {
		t.Fatalf("%d matchers, want 2", len(ms))
	}
	if p := ms[0].Predicate.SinglePredicate; p.Input.TypedConfig.HeaderName != "x-case" || p.ValueMatch["exact"] != "a" {
		t.Errorf("first matcher %+v, want x-case exact a", p)
	}
	if p := ms[1].Predicate.SinglePredicate; p.Input.TypedConfig.HeaderName != ":path" || p.ValueMatch["prefix"] != "/api/" {
		t.Errorf("second matcher %+v, want :path prefix /api/", p)
	}
	id := ms[0].OnMatch.Action.TypedConfig.BucketIDBuilder.BucketIDBuilder
	if id["name"].StringValue != "a" || id["tenant"].CustomValue.TypedConfig.HeaderName != "x-tenant-id" {
		t.Errorf("bucket id builder %+v", id)
	}
	if bytesCount := strings.Count(string(out), "bucket_matchers:"); bytesCount != 1 {
		t.Errorf("%d bucket_matchers, want the shipped ones replaced", bytesCount)
	}

	good := QuotaBucket{Header: "x-case", Exact: "a", ID: []QuotaIDPart{{Key: "name", Value: "a"}}}
	for name, bad := range map[string]QuotaBucket{
		"no id":            {Header: "x-case", Exact: "a"},
		"exact and prefix": {Header: "x-case", Exact: "a", Prefix: "b", ID: good.ID},
		"neither":          {Header: "x-case", ID: good.ID},
		"bad header":       {Header: "X Case", Exact: "a", ID: good.ID},
		"empty id key":     {Header: "x-case", Exact: "a", ID: []QuotaIDPart{{Value: "a"}}},
		"key twice":        {Header: "x-case", Exact: "a", ID: []QuotaIDPart{{Key: "k", Value: "a"}, {Key: "k", Value: "b"}}},
		"no value":         {Header: "x-case", Exact: "a", ID: []QuotaIDPart{{Key: "k"}}},
		"bad id header":    {Header: "x-case", Exact: "a", ID: []QuotaIDPart{{Key: "k", Header: "A:B"}}},
		"short interval":   {Header: "x-case", Exact: "a", ID: good.ID, ReportingInterval: 50 * time.Millisecond},
		"two strategies":   {Header: "x-case", Exact: "a", ID: good.ID, NoAssignment: &QuotaStrategy{Blanket: "ALLOW_ALL", PerUnit: 1, Unit: "SECOND"}},
		"no strategy":      {Header: "x-case", Exact: "a", ID: good.ID, NoAssignment: &QuotaStrategy{}},
		"bad blanket":      {Header: "x-case", Exact: "a", ID: good.ID, NoAssignment: &QuotaStrategy{Blanket: "MAYBE"}},
		"no fill interval": {Header: "x-case", Exact: "a", ID: good.ID, Expired: &QuotaStrategy{MaxTokens: 1}},
		"fallback and reuse": {Header: "x-case", Exact: "a", ID: good.ID, ReuseLast: true,
			Expired: &QuotaStrategy{Blanket: "DENY_ALL"}},
		"bad status":      {Header: "x-case", Exact: "a", ID: good.ID, DenyStatus: 99},
		"bad deny header": {Header: "x-case", Exact: "a", ID: good.ID, DenyHeaders: map[string]string{"Retry After": "1"}},
		"control char":    {Header: "x-case", Exact: "a\n", ID: good.ID},
	} {
		if out, err := WithQuotaBuckets(shippedQuota(t), "stub", bad); err == nil {
			t.Errorf("%s: accepted:\n%s", name, out)
		}
	}
	if _, err := WithQuotaBuckets(shippedQuota(t), "", good); err == nil {
		t.Error("empty domain accepted")
	}
	if _, err := WithQuotaBuckets(shippedQuota(t), "stub"); err == nil {
		t.Error("no bucket accepted")
	}
	if _, err := WithQuotaBuckets(shippedRLS(t), "stub", good); err == nil {
		t.Error("a bootstrap without the quota filter accepted")
	}
}

// FuzzQuotaValues: whatever a domain, a bucket id value, a matched value
// or a deny header holds (quotes, newlines, YAML syntax), the rendering is
// YAML with the same structure that reads back the values as given, or
// the value is refused with an error.
func FuzzQuotaValues(f *testing.F) {
	f.Add("example-api", "acme", "a", "1")
	f.Add("\"\n  - name: evil\n", "}]}: {", "&a *a !!binary", "# comment")
	f.Add("on", "no", "0x1f", "~")
	f.Add("\x00\xff", "\u2028", "\"", "'")
	base := shippedQuota(f)
	f.Fuzz(func(t *testing.T, domain, value, exact, header string) {
		if domain == "" || value == "" || exact == "" {
			t.Skip()
		}
		bad := false
		for _, s := range []string{domain, value, exact, header} {
			bad = bad || !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl)
		}
		out, err := WithQuotaBuckets(base, domain, QuotaBucket{Header: "x-case", Exact: exact,
			ID: []QuotaIDPart{{Key: "name", Value: value}}, DenyHeaders: map[string]string{"retry-after": header}})
		if bad {
			if err == nil {
				t.Fatalf("%q, %q, %q, %q accepted", domain, value, exact, header)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var b quotaBootstrap
		if err := yaml.Unmarshal(out, &b); err != nil {
			t.Fatalf("not YAML: %v", err)
		}
		if n := len(b.StaticResources.Listeners); n != 1 {
			t.Fatalf("%d listeners", n)
		}
		fs := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig.HTTPFilters
		if len(fs) != 3 || fs[1].TypedConfig.Domain != domain {
			t.Fatalf("filters %+v, want three with the domain %q", fs, domain)
		}
		ms := fs[1].TypedConfig.BucketMatchers.MatcherList.Matchers
		if len(ms) != 1 || ms[0].Predicate.SinglePredicate.ValueMatch["exact"] != exact {
			t.Fatalf("matchers %+v, want one matching %q", ms, exact)
		}
		a := ms[0].OnMatch.Action.TypedConfig
		if got := a.BucketIDBuilder.BucketIDBuilder["name"].StringValue; got != value {
			t.Fatalf("bucket id value %q, want %q", got, value)
		}
		if hs := a.DenyResponseSettings.ResponseHeadersToAdd; len(hs) != 1 || hs[0].Header.Value != header {
			t.Fatalf("deny headers %+v, want retry-after %q", hs, header)
		}
	})
}
