// Package monitoring holds no Go code of its own: its tests check the
// Grafana dashboard (deploy/grafana) and the Prometheus alerting rules
// (deploy/prometheus) with Prometheus's own rule and PromQL parsers, and
// against the metrics a real node exports (with NATS and Postgres, so that
// the cluster and overrides metrics are there too), docs/metrics.md
// and the runbooks in docs/operations.md.
package monitoring
