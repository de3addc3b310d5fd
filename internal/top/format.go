package top

import "strconv"

// Both surfaces of the live view, the status page and the top command,
// write rates the same way: plain decimals, never in exponent form.

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
