//go:build !race

package rls_test

// raceBuild: the race detector is on; it drops pooled objects at random,
// so the allocation budgets are judged without it (make test runs them so
// too).
const raceBuild = false
