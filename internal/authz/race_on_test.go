//go:build race

package authz_test

// raceBuild: the race detector is on; it allocates on its own and drops
// pooled values at random, so the allocation budgets are judged without
// it (make test runs them so too).
const raceBuild = true
