// Package deps holds, in its test, the direction of the module's
// dependencies: configuration and wire decoding (configfile, rlsconfig,
// problem, limits, snapshot, checkwire, match, counter) import no
// database, NATS, gRPC server or front-end package, the two configuration
// formats import neither the other, the counter imports nothing of
// replication, and the budget-sharing policy (share) imports no package
// of the module. The test reads the import graph with `go list -deps
// -json` and names the chain of imports behind every forbidden
// dependency.
//
// A rule that does not hold yet is listed as a named exception with its
// reason; the test fails when an exception is no longer needed, so that
// it is removed with the dependency. Its test also holds every function
// of internal/ and cmd/ to one screen (80 lines). The package has no code
// of its own.
package deps
