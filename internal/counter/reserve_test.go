package counter

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// A flood of keys in a bucket that is not reserved fills only
// MaxKeys − ReservedKeys: the reserved bucket still stores new keys, and
// its Peek reports Overflow only once its own keys filled the reserve.
func TestReservedBucketsKeepRoom(t *testing.T) {
	const flood, failures = 0, 1
	s, err := New(Config{MaxKeys: 100, Shards: 1, Reserved: []Bucket{failures}, ReservedKeys: 10})
	if err != nil {
		t.Fatal(err)
	}
	now := at(t, "12:00:00.000")
	lim := Limit{Limit: 5, ScaleMS: time.Minute.Milliseconds()}
	stored := 0
	for i := range 1000 {
		if !s.Take(flood, fmt.Sprintf("ip-%d", i), lim, now).Overflow {
			stored++
		}
	}
	if stored != 90 {
		t.Fatalf("flood stored %d keys, want 90 (MaxKeys − ReservedKeys)", stored)
	}
	if r := s.Peek(failures, "alice", lim, now); r.Overflow || !r.Allowed {
		t.Fatalf("Peek of a reserved bucket after the flood = %+v, want allowed, no overflow", r)
	}
	for i := range 10 {
		if r := s.Incr(failures, fmt.Sprintf("acct-%d", i), lim, 1, now); r.Overflow {
			t.Fatalf("failure %d on the reserve overflowed", i)
		}
	}
	if r := s.Peek(failures, "bob", lim, now); !r.Overflow {
		t.Fatalf("Peek with the reserve full of failures = %+v, want Overflow", r)
	}
	if r := s.Incr(failures, "bob", lim, 1, now); !r.Overflow {
		t.Fatalf("Incr with the table full = %+v, want Overflow", r)
	}
	// Merged counts of a bucket not reserved stay out of the reserve too.
	m, err := New(Config{MaxKeys: 10, Shards: 1, Track: true, Reserved: []Bucket{failures}, ReservedKeys: 5})
	if err != nil {
		t.Fatal(err)
	}
	merged := 0
	for i := range 20 {
		st := m.Merge(1, WindowCount{Bucket: flood, Key: fmt.Sprintf("k%d", i), ScaleMS: lim.ScaleMS, Window: now.UnixMilli() / lim.ScaleMS, Count: 1}, now)
		if st == Merged {
			merged++
		}
	}
	if merged != 5 {
		t.Fatalf("merged %d keys of a bucket not reserved, want 5", merged)
	}
	if r := m.Incr(failures, "alice", lim, 1, now); r.Overflow {
		t.Fatal("a failure found no room after a merge flood")
	}
}

func TestReservedKeysConfig(t *testing.T) {
	for _, c := range []Config{
		{MaxKeys: 10, Reserved: []Bucket{0}, ReservedKeys: 10},
		{MaxKeys: 10, Reserved: []Bucket{0}, ReservedKeys: -1},
	} {
		if _, err := New(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
	// The default reserve is a tenth of MaxKeys.
	s, err := New(Config{MaxKeys: 1000, Shards: 1, Reserved: []Bucket{3}})
	if err != nil {
		t.Fatal(err)
	}
	if r := s.shards[0].reserve; r != 100 {
		t.Fatalf("default reserve %d, want 100", r)
	}
	if s.MaxKeys() != 1000 || s.ReservedKeys() != 100 {
		t.Errorf("MaxKeys %d ReservedKeys %d, want 1000 and 100", s.MaxKeys(), s.ReservedKeys())
	}
	// Without reserved buckets every key may use the whole table.
	s, err = New(Config{MaxKeys: 1000, Shards: 1, ReservedKeys: 500})
	if err != nil {
		t.Fatal(err)
	}
	if r := s.room(&s.shards[0], 0); r != 1000 {
		t.Fatalf("room without reserved buckets %d, want 1000", r)
	}
	if s.ReservedKeys() != 0 {
		t.Errorf("ReservedKeys %d without reserved buckets, want 0", s.ReservedKeys())
	}
	// A reload that reserves a bucket brings the configured reserve in.
	s.SetReserved([]Bucket{1})
	if r0, r1 := s.room(&s.shards[0], 0), s.room(&s.shards[0], 1); r0 != 500 || r1 != 1000 || s.ReservedKeys() != 500 {
		t.Errorf("after SetReserved: room %d and %d, ReservedKeys %d; want 500, 1000, 500", r0, r1, s.ReservedKeys())
	}
	s.SetReserved(nil)
	if r := s.room(&s.shards[0], 0); r != 1000 || s.ReservedKeys() != 0 {
		t.Errorf("after SetReserved(nil): room %d, ReservedKeys %d; want 1000, 0", r, s.ReservedKeys())
	}
	// The configured bound, not the per-shard rounding (8 shards of 2).
	s, err = New(Config{MaxKeys: 10, Shards: 8, Reserved: []Bucket{0}, ReservedKeys: 3})
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxKeys() != 10 || s.ReservedKeys() != 3 {
		t.Errorf("MaxKeys %d ReservedKeys %d, want 10 and 3", s.MaxKeys(), s.ReservedKeys())
	}
	if s, err = New(Config{}); err != nil || s.MaxKeys() != DefaultMaxKeys {
		t.Errorf("default MaxKeys: %v %v", s, err)
	}
}
