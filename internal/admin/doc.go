// Package admin serves the admin listener: GET /v1/top, the top keys of
// every bucket as JSON, and a status page at / (server-rendered HTML that
// refreshes itself, no JavaScript) with the buckets, their rates and top
// keys, the configuration's generation and last reload, where the
// overrides come from (read through [State]), the cluster's peers, and
// the node's state read from its metrics (connections, the counter).
//
// Keys are personal data (client IPs, accounts, tenants), so the
// listener is off unless an address is given, and [New] refuses an
// address that is not loopback unless a bearer token is configured;
// with one, every request must carry it. HideKeys shows a keyed hash
// (HMAC-SHA-256 under a key drawn at start, so it is stable for the
// process's life and means nothing elsewhere) instead of each key. Only
// GET and HEAD are served; the query is bounded and its parameters
// checked; every key is escaped on the page (html/template) and the page
// forbids scripts (Content-Security-Policy).
//
// Failure mode: New fails when the listener cannot be bound or the
// configuration is unsafe; Run returns when its context ends. The JSON
// schema is in docs/operations.md.
package admin
