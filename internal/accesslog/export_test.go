package accesslog

import accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

// Entry exposes the decoding of one access-log entry to the fuzz test.
func (rec *Recorder) Entry(e *accesslogv3.HTTPAccessLogEntry) string {
	return entryResultNames[rec.entry(e)]
}

// RouteIndex exposes the route lookup of reports to the tests.
func RouteIndex(cfg Config, ref string) int { return cfg.routeIndex(ref) }
