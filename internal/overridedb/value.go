package overridedb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// The stored value of tenant_limits.limits is a JSON object of bucket name
// to {"limit": N, "scale_ms": MS}; the database's checks hold SQL to that
// shape (migrations/0001_tenant_limits.sql), and ParseLimits reads it as
// they define it, for the CLI and for a cache that meets a row written
// with the checks bypassed.

// EntryProblem is one entry of a stored value that cannot be used.
type EntryProblem struct {
	Bucket string
	Err    error
}

// ParseLimits decodes a stored tenant_limits.limits value into its entries,
// sorted by bucket, checking only the shape (not the configuration). A
// value that is not a JSON object is an error; an entry with a bad shape is
// reported in problems and left out, without hiding the others.
func ParseLimits(raw []byte) (entries []limits.Override, problems []EntryProblem, err error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, nil, fmt.Errorf("%w: limits must be a JSON object of bucket name to {\"limit\": N, \"scale_ms\": MS}, not %.80s", limits.ErrInvalid, raw)
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		o, err := parseEntry(name, m[name])
		if err != nil {
			problems = append(problems, EntryProblem{name, err})
			continue
		}
		entries = append(entries, o)
	}
	return entries, problems, nil
}

func parseEntry(name string, raw json.RawMessage) (limits.Override, error) {
	o := limits.Override{Bucket: name}
	if !match.ValidBucketName(name) {
		return o, fmt.Errorf("%w: %q is not a bucket name", limits.ErrInvalid, name)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return o, fmt.Errorf("%w: want {\"limit\": N, \"scale_ms\": MS}, not %.80s", limits.ErrInvalid, raw)
	}
	for k := range fields {
		if k != "limit" && k != "scale_ms" {
			return o, fmt.Errorf("%w: unknown field %q (want only \"limit\" and \"scale_ms\")", limits.ErrInvalid, k)
		}
	}
	var err error
	if o.Limit, err = wholeNumber(fields["limit"], "limit"); err != nil {
		return o, err
	}
	if o.ScaleMS, err = wholeNumber(fields["scale_ms"], "scale_ms"); err != nil {
		return o, err
	}
	return o, o.Validate()
}

// wholeNumber accepts only a plain JSON integer: 200, not 200.0, "200" or 2e2.
func wholeNumber(raw json.RawMessage, field string) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return 0, fmt.Errorf("%w: %q is missing", limits.ErrInvalid, field)
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: %q must be a whole number, not %.40s", limits.ErrInvalid, field, raw)
		}
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is out of range: %.40s", limits.ErrInvalid, field, raw)
	}
	return n, nil
}
