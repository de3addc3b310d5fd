package limits

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// Builtin is the last step of a bucket's configured limit (see
// configfile.Bucket.Configured): the defaults of the buckets the product
// ships, for a configuration that names one without a limit.
func Builtin(name string) (counter.Limit, bool) {
	const sec, min = 1000, 60_000
	switch name {
	case "activity_create":
		return counter.Limit{Limit: 100, ScaleMS: sec}, true
	case "upload":
		return counter.Limit{Limit: 10, ScaleMS: sec}, true
	case "inbound":
		return counter.Limit{Limit: 500, ScaleMS: sec}, true
	case "token_generate", "token_create":
		return counter.Limit{Limit: 10, ScaleMS: min}, true
	case "login_ip", "login_account":
		return counter.Limit{Limit: 5, ScaleMS: min}, true
	}
	return counter.Limit{}, false
}

// Overrides are per-tenant limits by bucket id (counter.Bucket) and the
// request's key of it (the overrides cache's OverrideFor is one). They are
// consulted on the Check path: answers come from memory, never from I/O.
type Overrides interface {
	OverrideFor(bucket counter.Bucket, key string) (counter.Limit, bool)
}

// ParseWindow is the one grammar of a window length, for the
// configuration's per and an override's WINDOW alike: a unit name, in any
// case — 1s, s, sec, second; 1m, m, min, minute; 1h, h, hour; 1d, d, day —
// or a Go duration of whole milliseconds (500ms, 90s, 2h), from 1 ms to
// counter.MaxScaleMS. Overrides narrow it further to [Scales].
func ParseWindow(s string) (ms int64, err error) {
	switch strings.ToLower(s) {
	case "1s", "s", "sec", "second":
		return 1000, nil
	case "1m", "m", "min", "minute":
		return 60_000, nil
	case "1h", "h", "hour":
		return 3_600_000, nil
	case "1d", "d", "day":
		return 86_400_000, nil
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not a duration (like 1s, 500ms, 1m, 1h, or second, minute, hour, day)", s)
	case d <= 0 || d%time.Millisecond != 0:
		return 0, fmt.Errorf("%q must be a positive whole number of milliseconds", s)
	case d.Milliseconds() > counter.MaxScaleMS:
		return 0, fmt.Errorf("%q is longer than the longest window, %s", s, time.Duration(counter.MaxScaleMS)*time.Millisecond)
	}
	return d.Milliseconds(), nil
}

// FormatWindow writes a window length as ParseWindow reads it back: a
// day as "1d", else in its largest whole unit of Go's durations ("1s",
// "1m", "90s", "1h", "168h"), or as Go writes it when it is no whole
// number of seconds ("1.5s", "250ms").
func FormatWindow(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	if d == 24*time.Hour {
		return "1d"
	}
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if d >= u.d && d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}
