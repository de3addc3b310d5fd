package failures

import accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

// Entry exposes the decoding of one access-log entry to the fuzz test.
func (rec *Recorder) Entry(e *accesslogv3.HTTPAccessLogEntry) string {
	return entryResultNames[rec.entry(e)]
}
