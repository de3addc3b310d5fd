package limits

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// ErrInvalid is wrapped by every validation error: bad tenant, key, actor
// (overridedb.ValidateActor), bucket or limit. Nothing was written.
var ErrInvalid = errors.New("invalid override")

// MaxTenantBytes is the longest tenant id an override can have (the
// database refuses longer ones; the cache does not even look them up).
const MaxTenantBytes = 256

// Scale is a window length an override may use.
type Scale struct {
	MS   int64
	Name string // as written after the slash: 1s, 1m, 1h, 1d
}

// Scales are the allowed override windows. The database checks the same
// list (internal/overridedb/migrations/0001_tenant_limits.sql): a fixed,
// small set keeps overrides readable and whole seconds in the RateLimit
// header fields.
var Scales = []Scale{{1000, "1s"}, {60_000, "1m"}, {3_600_000, "1h"}, {86_400_000, "1d"}}

func scaleNames() string {
	names := make([]string, len(Scales))
	for i, s := range Scales {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

// Override is one bucket's override for one tenant, as stored.
type Override struct {
	Bucket  string
	Limit   int64 // hits per window
	ScaleMS int64 // window length
}

// Rate formats the limit as LIMIT/SCALE, e.g. "200/1s".
func (o Override) Rate() string { return FormatRate(o.Limit, o.ScaleMS) }

// FormatRate formats a limit and window as the CLI takes them: "200/1s".
func FormatRate(limit, scaleMS int64) string {
	return strconv.FormatInt(limit, 10) + "/" + FormatWindow(scaleMS)
}

// isOverrideWindow is the override policy on top of the window grammar
// (ParseWindow): only the windows of Scales.
func isOverrideWindow(ms int64) bool {
	return slices.ContainsFunc(Scales, func(s Scale) bool { return s.MS == ms })
}

// Valid is Validate without building an error.
func (o Override) Valid() bool {
	return o.Limit >= 1 && o.Limit <= counter.MaxLimit && isOverrideWindow(o.ScaleMS)
}

// Validate checks the limit and window, not the bucket (see [Validate]).
func (o Override) Validate() error {
	if err := (counter.Limit{Limit: o.Limit, ScaleMS: o.ScaleMS}).Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !isOverrideWindow(o.ScaleMS) {
		return fmt.Errorf("%w: window %d ms is not one of %s", ErrInvalid, o.ScaleMS, scaleNames())
	}
	return nil
}

// ParseRate parses LIMIT/SCALE as the CLI takes it: "200/1s", "10/1m",
// "5/hour"; the scale is any window of the one grammar ([ParseWindow]:
// 1s or s or second, 1m or m or minute, …, or a Go duration like 60s)
// that is one of [Scales].
func ParseRate(s string) (limit, scaleMS int64, err error) {
	l, sc, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("%w: %q is not LIMIT/WINDOW (like 200/1s or 10/1m)", ErrInvalid, s)
	}
	limit, err = strconv.ParseInt(l, 10, 64)
	if err != nil || limit < 1 || limit > counter.MaxLimit || l[0] == '+' {
		return 0, 0, fmt.Errorf("%w: limit %q must be a whole number from 1 to %d", ErrInvalid, l, counter.MaxLimit)
	}
	scaleMS, err = ParseWindow(sc)
	if err != nil || !isOverrideWindow(scaleMS) {
		return 0, 0, fmt.Errorf("%w: window %q must be one of %s", ErrInvalid, sc, scaleNames())
	}
	return limit, scaleMS, nil
}

// ValidateTenant checks a tenant id: 1 to 256 bytes of UTF-8 without
// control characters, as the database requires.
func ValidateTenant(tenant string) error { return validateText("tenant", tenant, MaxTenantBytes) }

// validateText checks an identifier stored as text: 1 to max bytes of
// UTF-8 without control characters (which would forge lines in logs and
// terminals).
func validateText(what, v string, max int) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: the %s is empty", ErrInvalid, what)
	case len(v) > max:
		return fmt.Errorf("%w: the %s is %d bytes long, more than %d", ErrInvalid, what, len(v), max)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: the %s %q is not valid UTF-8", ErrInvalid, what, v)
	case strings.ContainsFunc(v, unicode.IsControl):
		return fmt.Errorf("%w: the %s %q contains control characters", ErrInvalid, what, v)
	}
	return nil
}

// MaxKeyValueBytes is the longest key an owner can be recorded for (the
// database refuses longer ones; the cache does not look them up).
const MaxKeyValueBytes = 1024

var keyNameRE = regexp.MustCompile("^([A-Za-z_][A-Za-z0-9_]{0,63}|header:[!#$%&'*+.^_`|~0-9a-z-]{1,120})$")

// OwnerKeyName is the name under which owners of a bucket's keys are
// recorded: the path parameter's name for a path:NAME key ("channel"),
// "header:NAME" for a header key. ok is false for keys no tenant can own:
// the tenant itself (its override follows the key directly) and the
// client's identities (ip, account).
func OwnerKeyName(k match.KeySpec) (name string, ok bool) {
	switch k.Kind {
	case match.KeyPathParam:
		return k.Name, true
	case match.KeyHeader:
		return "header:" + k.Name, true
	}
	return "", false
}

// ValidateKeyName checks the key name of an owner: a path parameter name,
// or header:NAME, as the database requires.
func ValidateKeyName(name string) error {
	if !keyNameRE.MatchString(name) {
		return fmt.Errorf("%w: key name %q must be a path parameter's name (like channel) or header:NAME (lowercase)", ErrInvalid, name)
	}
	return nil
}

// ValidateKeyValue checks the key an owner is recorded for: 1 to 1024 bytes
// of UTF-8 without control characters.
func ValidateKeyValue(value string) error { return validateText("key", value, MaxKeyValueBytes) }
