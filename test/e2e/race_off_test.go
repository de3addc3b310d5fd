//go:build !race

package e2e

// raceBuild: the race detector is on. It slows the load generator in the
// test process below the rate the stall test needs, so that test is
// judged without it (make test runs it so too).
const raceBuild = false
