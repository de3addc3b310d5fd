// Package kubernetes holds no Go code of its own: this folder is the
// kustomize base, components and overlays of ratelimit-authz (plus the
// example NATS cluster and Envoy), and its tests render them with
// kustomize's own library, decode every object strictly into the
// Kubernetes API types, and check them against the ratelimit-authz binary
// (flags, environment, ports, paths, drain timing), the real Envoy, the
// real nats-server and a real Postgres.
package kubernetes
