package rlsconfig

import (
	"strconv"
	"strings"
)

// units in the order of their values 1…7.
var unitNames = [...]string{"SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}

var unitSeconds = [...]int64{1, 60, 3600, 86400, 30 * 86400, 365 * 86400, 7 * 86400}

const numUnits = len(unitNames)

func (u Unit) valid() bool { return u >= Second && int(u) <= numUnits }

// Seconds is the unit's window length, 0 for an invalid Unit.
func (u Unit) Seconds() int64 {
	if !u.valid() {
		return 0
	}
	return unitSeconds[u-1]
}

// String is the unit's upper-case name ("SECOND" …), "Unit(n)" when invalid.
func (u Unit) String() string {
	if !u.valid() {
		return "Unit(" + strconv.Itoa(int(u)) + ")"
	}
	return unitNames[u-1]
}

// parseUnit reads a unit name in any case, as upstream (strings.ToUpper).
func parseUnit(s string) (Unit, bool) {
	up := strings.ToUpper(s)
	for i, n := range unitNames {
		if n == up {
			return Unit(i + 1), true
		}
	}
	return 0, false
}
