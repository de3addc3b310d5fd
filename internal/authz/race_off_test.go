//go:build !race

package authz_test

// raceBuild: the race detector is on (see race_on_test.go).
const raceBuild = false
