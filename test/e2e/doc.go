// Package e2e holds black-box end-to-end tests: the built ratelimit-authz
// binary behind a real Envoy, with a small upstream HTTP server in the test.
//
// The tests need Envoy (installed by scripts/install-envoy.sh into .tools/)
// and a buildable ./cmd/ratelimit-authz; the cluster test
// (TestClusterThroughEnvoy: three nodes behind one Envoy, faults under
// load) also needs nats-server (scripts/install-nats.sh) and PostgreSQL
// (scripts/install-postgres.sh). When one is missing they skip, except
// under CI=true, where they fail. The RLS tests (rls_*_test.go) run
// envoy/ratelimit-rls.yaml, Envoy's own rate limit filter, against the
// server's ShouldRateLimit serving a runtime directory given by
// envoyproxy/ratelimit's RUNTIME_* variables; their cluster test needs
// nats-server too. Everything listens on 127.0.0.1 with
// ports picked at run time; Envoy runs envoy/ratelimit-authz.yaml with
// only its addresses rewritten (one endpoint per node in each of its two
// ratelimit-authz clusters), so the shipped bootstrap is what is tested:
// the ext_authz filter calls each node's lean Check listener
// (--check-addr) and the failure access log its gRPC port.
// TestCheckOnGRPCPortThroughEnvoy points the ext_authz cluster at the
// gRPC port instead, for servers without the lean listener.
//
// Environment:
//
//	CI=true         a missing prerequisite is a failure, not a skip
//	E2E_ENVOY_BIN   use this envoy binary instead of running the installer
//	E2E_SERVER_BIN  use this ratelimit-authz binary instead of building one
//	E2E_SERVER_CONFIG use this server config instead of config/ratelimit.yaml
//	NATS_SERVER_BIN use this nats-server instead of running the installer
//	PG_BIN          the folder of PostgreSQL's initdb, pg_ctl and postgres
//	E2E_LOG_DIR     parent folder for the per-test log folders (default $TMPDIR)
//	E2E_KEEP_LOGS   keep the log folders of passing tests too
//
// Each test writes every process's output to its own log folder, removed
// when the test passes and kept (path and tails printed) when it fails.
package e2e
