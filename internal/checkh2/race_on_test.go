//go:build race

package checkh2

// raceBuild: the race detector is on; it allocates on its own, so the
// allocation budgets are judged without it (make test runs them so too).
const raceBuild = true
