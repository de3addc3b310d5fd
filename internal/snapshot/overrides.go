package snapshot

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
)

// OverrideTarget returns the bucket a tenant override filed under name
// would apply to, overridable or not: a rules bucket, or an overridable
// RLS rule (by its rule name, Bucket.OverrideName). ok is false when
// there is none.
func (s *Snapshot) OverrideTarget(name string) (b *Bucket, ok bool) {
	for i := range s.Buckets {
		if b := &s.Buckets[i]; name != "" && b.OverrideName == name {
			return b, true
		}
	}
	return nil, false
}

// overridableNames lists, sorted, the names tenant overrides are filed
// under.
func (s *Snapshot) overridableNames() []string {
	var names []string
	for i := range s.Buckets {
		if s.Buckets[i].Overridable {
			names = append(names, s.Buckets[i].OverrideName)
		}
	}
	slices.Sort(names)
	return names
}

// OverrideBucket returns the overridable bucket of an override filed
// under name, or an error wrapping limits.ErrInvalid that names the
// overridable buckets when it is unknown or not overridable.
func (s *Snapshot) OverrideBucket(name string) (*Bucket, error) {
	b, known := s.OverrideTarget(name)
	allowed := s.overridableNames()
	list := strings.Join(allowed, ", ")
	if len(allowed) == 0 {
		list = "none (no bucket in the configuration has overridable: true)"
	}
	switch {
	case !known:
		return nil, fmt.Errorf("%w: unknown bucket %q; buckets that accept tenant overrides: %s", limits.ErrInvalid, name, list)
	case !b.Overridable:
		return nil, fmt.Errorf("%w: bucket %q does not accept tenant overrides; buckets that do: %s", limits.ErrInvalid, name, list)
	}
	return b, nil
}

// ValidateOverride checks a whole override against the snapshot: the
// bucket is overridable, the limit within bounds, the window allowed.
func (s *Snapshot) ValidateOverride(o limits.Override) error {
	if _, err := s.OverrideBucket(o.Bucket); err != nil {
		return err
	}
	return o.Validate()
}

// OwnerKeyNames lists, sorted and once each, the key names of the
// overridable buckets that take their override from a key owner
// (limits.OwnerKeyName).
func (s *Snapshot) OwnerKeyNames() []string {
	var names []string
	for i := range s.Buckets {
		b := &s.Buckets[i]
		if n, ok := limits.OwnerKeyName(b.Key); ok && b.Overridable && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// CheckOwnerKeyName returns an error wrapping limits.ErrInvalid, naming
// the key names that take owners, when no overridable bucket takes its
// override from the owner of a key named name.
func (s *Snapshot) CheckOwnerKeyName(name string) error {
	if err := limits.ValidateKeyName(name); err != nil {
		return err
	}
	names := s.OwnerKeyNames()
	if slices.Contains(names, name) {
		return nil
	}
	list := strings.Join(names, ", ")
	if len(names) == 0 {
		list = "none (no overridable bucket is keyed by a path parameter or a header)"
	}
	return fmt.Errorf("%w: no overridable bucket is keyed by %q; key names that take owners: %s", limits.ErrInvalid, name, list)
}
