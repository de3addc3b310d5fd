package loadresult

import "time"

// Accuracy is what the accuracy program (bench/accuracy) prints and the
// bench runner reads: per row and per burst scenario, what a cluster of
// nodes in one process admitted of the Takes offered.
type Accuracy struct {
	Nodes        int       `json:"nodes"`
	Limit        int64     `json:"limit"`
	WindowMS     int64     `json:"window_ms"`
	SyncInterval string    `json:"sync_interval"`
	Windows      int       `json:"windows"`
	GoVersion    string    `json:"go_version"`
	StartedAt    time.Time `json:"started_at"`
	ElapsedS     float64   `json:"elapsed_s"`
	// PeersSeen: before the load, every node counted the other two as
	// peers (ratelimit_authz_replicate_peers). False when the metric was
	// not there to read; the load then started a heartbeat after Ready.
	PeersSeen bool            `json:"peers_seen"`
	Rows      []AccuracyRow   `json:"rows"`
	Bursts    []AccuracyBurst `json:"bursts,omitempty"`
}

// AccuracyBurst is one burst scenario, run Runs times, each on a key that no node
// has seen, in a window of its own: the Takes each bursting node offered
// per run, at a pace, and per run what the cluster admitted of them.
type AccuracyBurst struct {
	Scenario string `json:"scenario"`
	// Nodes is the nodes that burst; PerNode the Takes each offers per
	// run, PerMS how many it takes each millisecond (0: all in the first).
	Nodes   []int   `json:"nodes"`
	PerNode int64   `json:"per_node"`
	PerMS   float64 `json:"per_ms"`
	// Second: each run's key had a burst in the window before too (not
	// counted): the same key in its next window.
	Second bool  `json:"second,omitempty"`
	Runs   int   `json:"runs"`
	Min    int64 `json:"min"`
	// Median, Max: of Admitted.
	Median float64 `json:"median"`
	Max    int64   `json:"max"`
	// Admitted and AdmittedPerNode are per run: the Takes admitted in the
	// key's window, in all and per node. Late is per run the Takes made
	// after that window had ended (none, unless the machine stalled the
	// drivers for most of a window): not counted.
	Admitted        []int64   `json:"admitted"`
	AdmittedPerNode [][]int64 `json:"admitted_per_node"`
	Late            []int64   `json:"late"`
	// Reach90MS is per run how long after the burst's start the cluster
	// had admitted 90% of the limit (-1: never); LastMS when it admitted
	// its last Take of the run.
	Reach90MS []float64 `json:"reach90_ms"`
	LastMS    []float64 `json:"last_ms"`
	// MaxBehindMS: how late, at most, a node took the oldest Take due.
	MaxBehindMS float64 `json:"max_behind_ms"`
}

// AccuracyRow is one key: an algorithm, a multiple of the limit offered and a
// distribution over the nodes. The per-window slices are in window order.
type AccuracyRow struct {
	Algorithm    string    `json:"algorithm"`
	Multiple     float64   `json:"multiple"`
	Distribution string    `json:"distribution"`
	Shares       []float64 `json:"shares"` // of the offered load, per node
	Key          string    `json:"key"`
	OfferedPerS  float64   `json:"offered_per_s"` // over the cluster
	Windows      int       `json:"windows"`
	Min          int64     `json:"min"`
	Median       float64   `json:"median"`
	Max          int64     `json:"max"`
	// WindowStartMS, Offered, Admitted and AdmittedPerNode are per
	// counted window: its start (unix ms), the Takes made in it and those
	// admitted, in all and per node.
	WindowStartMS   []int64   `json:"window_start_ms"`
	Offered         []int64   `json:"offered"`
	Admitted        []int64   `json:"admitted"`
	AdmittedPerNode [][]int64 `json:"admitted_per_node"`
	// MaxBehindMS is how far behind its schedule any node's oldest due
	// Take of this row was when its batch ran: the pacing's accuracy.
	MaxBehindMS float64 `json:"max_behind_ms"`
}

// Row is the run's row of an algorithm, multiple and distribution.
func (run *Accuracy) Row(alg string, mult float64, dist string) (AccuracyRow, bool) {
	if run == nil {
		return AccuracyRow{}, false
	}
	for _, x := range run.Rows {
		if x.Algorithm == alg && x.Multiple == mult && x.Distribution == dist && x.Windows > 0 {
			return x, true
		}
	}
	return AccuracyRow{}, false
}

// Burst is the run's burst scenario of that name, if it ran.
func (run *Accuracy) Burst(scenario string) (AccuracyBurst, bool) {
	if run == nil {
		return AccuracyBurst{}, false
	}
	for _, x := range run.Bursts {
		if x.Scenario == scenario && x.Runs > 0 {
			return x, true
		}
	}
	return AccuracyBurst{}, false
}
