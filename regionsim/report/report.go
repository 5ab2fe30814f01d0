package report

import (
	"encoding/json"
	"io"
	"time"

	"github.com/idem-dev/idem/regionsim/check"
)

// Report is the result of one regionsim run.
type Report struct {
	// Passed is false when any invariant broke in any scenario (or a
	// scenario could not run).
	Passed bool `json:"passed"`
	// Seed and Command replay the run.
	Seed    uint64 `json:"seed"`
	Command string `json:"command"`
	// Started and ElapsedS: when the run began and how long it took.
	Started  time.Time `json:"started"`
	ElapsedS float64   `json:"elapsed_s"`
	// Setup describes the simulated deployment.
	Setup Setup `json:"setup"`
	// Scenarios holds one entry per scenario run, in order.
	Scenarios []Scenario `json:"scenarios"`
	// WorkDir is where process logs and data dirs were kept ("" when
	// removed).
	WorkDir string `json:"work_dir,omitempty"`
}

// Setup is the simulated deployment.
type Setup struct {
	Regions          []string `json:"regions"`
	NodesPerRegion   int      `json:"nodes_per_region"`
	ShardsPerRegion  int      `json:"shards_per_region"`
	Replicas         int      `json:"replicas"`
	Survival         string   `json:"survival"`
	Links            []Link   `json:"links"`
	JitterMs         float64  `json:"jitter_ms"`
	Loss             float64  `json:"loss"`
	DurationS        float64  `json:"duration_s"`
	LeaseMs          int64    `json:"lease_ms"`
	ClockSkewMarginS float64  `json:"clock_skew_margin_s"`
	WorkersPerRegion int      `json:"workers_per_region"`
	RatePerRegion    float64  `json:"rate_per_region"`
	Routers          bool     `json:"routers"`
}

// Link is the one-way latency between two regions (both directions).
type Link struct {
	A         string  `json:"a"`
	B         string  `json:"b"`
	LatencyMs float64 `json:"latency_ms"`
}

// Scenario is the result of one scenario.
type Scenario struct {
	Name        string `json:"name"`
	FailureMode string `json:"failure_mode"`
	Description string `json:"description"`
	// Passed: every check of idem (with the ledger's guard on) passed.
	Passed bool `json:"passed"`
	// Error is set when the scenario could not run to the end.
	Error string `json:"error,omitempty"`
	// LoadS is how long load ran; DrainS how long in-flight payments then
	// took to finish.
	LoadS  float64 `json:"load_s"`
	DrainS float64 `json:"drain_s"`
	Faults []Fault `json:"faults"`
	// Checks are idem's invariants.
	Checks []check.Outcome `json:"checks"`
	// Phases: availability and latency of idem's client attempts per phase
	// (before, during, after the faults) and client region.
	Phases []Phase `json:"phases"`
	// FaultWindows: the same figures inside each fault's window.
	FaultWindows []Phase `json:"fault_windows"`
	// Systems compares idem with what the same workload got elsewhere.
	Systems []System `json:"systems"`
	// Timeline: idem's throughput and latency per second and region.
	Timeline []Series `json:"timeline"`
	// Ops counts the calls recorded, by kind and result.
	Ops map[string]int `json:"ops"`
}

// Fault is one fault of a scenario, as it happened.
type Fault struct {
	Name   string  `json:"name"`
	Detail string  `json:"detail,omitempty"`
	StartS float64 `json:"start_s"`
	EndS   float64 `json:"end_s"`
	Error  string  `json:"error,omitempty"`
}

// Phase is availability and latency over one window for one client region
// ("all" for every region).
type Phase struct {
	Phase        string  `json:"phase"`
	Region       string  `json:"region"`
	Attempts     int     `json:"attempts"`
	OK           int     `json:"ok"`
	Availability float64 `json:"availability"`
	P50Ms        float64 `json:"p50_ms"`
	P90Ms        float64 `json:"p90_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
}

// System is what one system let through under the scenario's workload.
type System struct {
	Name string `json:"name"`
	// Payments started, completed (a response delivered), abandoned (no
	// response within the payment's budget).
	Payments  int `json:"payments"`
	Completed int `json:"completed"`
	Abandoned int `json:"abandoned"`
	// DoubleCharged: keys the ledger charged more than once.
	DoubleCharged int `json:"double_charged"`
	// DoubleChargeCauses counts the second and later charges of
	// double-charged keys by what the instance that wrote them was doing
	// (its injected behaviour: stall, slow, normal, ...).
	DoubleChargeCauses map[string]int `json:"double_charge_causes,omitempty"`
	// ExactlyOnceViolations: the exactly-once check's violations (double
	// charges plus completed keys not charged exactly once).
	ExactlyOnceViolations int `json:"exactly_once_violations"`
	// ChangedReplays: responses that differed from the key's first.
	ChangedReplays int `json:"changed_replays"`
	// LostCompletions: acknowledged completions missing or changed at the
	// end.
	LostCompletions int `json:"lost_completions"`
	// Linearizability: violations of the per-key model (-1: not checked,
	// the system has no such contract).
	Linearizability int `json:"linearizability_violations"`
	// FencedWrites: ledger writes refused for a stale fencing token.
	FencedWrites int `json:"fenced_writes"`
	// Resumed: attempts that reclaimed a key with an earlier attempt's
	// checkpoint and resumed from it (recorded its charge instead of
	// reading the ledger and charging).
	Resumed int `json:"resumed_attempts"`
	// Availability and P99Ms of client attempts over the whole scenario.
	Availability float64 `json:"availability"`
	P99Ms        float64 `json:"p99_ms"`
	// Errors counts failed client attempts by what the client saw.
	Errors map[string]int `json:"errors,omitempty"`
	Note   string         `json:"note,omitempty"`
}

// Series is one region's timeline.
type Series struct {
	Region string  `json:"region"`
	Points []Point `json:"points"`
}

// Point is one second of a timeline.
type Point struct {
	T      float64 `json:"t"`
	OK     int     `json:"ok"`
	Failed int     `json:"failed"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
}

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
