package top

import (
	"strconv"
	"time"
)

// Both surfaces of the live view, the status page and the top command,
// write figures the same way: rates as plain decimals, never in exponent
// form, and window lengths in their largest whole unit.

// Rate is n events over secs seconds as a rate: three significant digits
// below 100 a second, whole numbers above ("1000000", never "1e+06"); "0"
// for an empty period.
func Rate(n uint64, secs float64) string {
	if secs <= 0 || n == 0 {
		return "0"
	}
	r := float64(n) / secs
	switch {
	case r >= 100:
		return strconv.FormatFloat(r, 'f', 0, 64)
	case r >= 10:
		return strconv.FormatFloat(r, 'f', 1, 64)
	default:
		return strconv.FormatFloat(r, 'f', 2, 64)
	}
}

// Window is a window length in ms in its largest whole unit: "1s", "1m",
// "1h", "1d"; what is not a whole number of seconds as Go writes it.
func Window(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if d >= u.d && d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}
