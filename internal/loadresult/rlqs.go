package loadresult

// RLQS is what a run of `ratelimit-bench rlqs --json` measured: reports
// sent, answers received, and how long a bucket id's first assignment
// took after its first report.
type RLQS struct {
	Tool        string             `json:"tool"`
	Mode        string             `json:"mode"` // "rlqs"
	Target      string             `json:"target"`
	Streams     int                `json:"streams"`
	Buckets     int                `json:"buckets_per_stream"`
	IntervalS   float64            `json:"interval_s"`
	ElapsedS    float64            `json:"elapsed_s"`
	Reports     int64              `json:"reports"` // messages sent, initial ones included
	Usages      int64              `json:"usages"`  // bucket usages in them
	Answers     int64              `json:"answers"` // response messages received
	Actions     map[string]int64   `json:"actions"` // bucket actions by kind
	FirstAssign map[string]float64 `json:"first_assignment_us"`
	Errors      int64              `json:"errors"`
	ErrorKinds  map[string]int64   `json:"error_kinds,omitempty"`
}
