package history

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"
)

// Kind is the call an Op made.
type Kind uint8

// The calls of the contract.
const (
	Reserve Kind = iota + 1
	Heartbeat
	Complete
	Release
	Get
	Checkpoint
)

func (k Kind) String() string {
	switch k {
	case Reserve:
		return "reserve"
	case Heartbeat:
		return "heartbeat"
	case Complete:
		return "complete"
	case Release:
		return "release"
	case Get:
		return "get"
	case Checkpoint:
		return "checkpoint"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Result classifies how a call ended.
type Result uint8

const (
	// Unknown: no decision reached the caller (timeout, UNAVAILABLE,
	// connection lost); the call may or may not have been applied, now or
	// later.
	Unknown Result = iota
	// OK: the store decided and answered (any reserve outcome, a 200).
	OK
	// NotOwner: the store answered NOT_OWNER.
	NotOwner
	// NotFound: a get answered NOT_FOUND.
	NotFound
	// Failed: the store answered another decided error (a bug for this
	// workload: it only sends valid requests).
	Failed
)

func (r Result) String() string {
	return [...]string{"unknown", "ok", "not_owner", "not_found", "failed"}[r]
}

// Reserve outcomes and Get states, spelled as in the contract.
const (
	Acquired            = "ACQUIRED"
	Reclaimed           = "RECLAIMED"
	InProgress          = "IN_PROGRESS"
	Completed           = "COMPLETED"
	FingerprintMismatch = "FINGERPRINT_MISMATCH"
)

// Infinity is the Return of a call whose outcome is unknown: it may take
// effect at any time after its call.
const Infinity = math.MaxInt64

// Op is one call and its answer.
type Op struct {
	ID     int
	Client int    // the worker (porcupine's client id)
	Key    string // namespace-qualified key
	Kind   Kind
	Region string // region of the caller
	Via    string // region of the router the call went through

	// Input.
	Owner       string
	Fingerprint string
	LeaseMs     int64
	Response    string // complete: the canonical form of the response stored

	// Times: nanoseconds since the run started (monotonic). Return is
	// Infinity when Result is Unknown.
	Call, Return int64

	// Output.
	Result  Result
	Err     string // the error text, for Unknown and Failed
	Outcome string // reserve: the outcome; get: the state
	Fencing uint64
	// PrevFencing: RECLAIMED's previous_fencing_token.
	PrevFencing uint64
	// LeaseExpires (ACQUIRED, RECLAIMED, IN_PROGRESS, heartbeat, get of an
	// IN_PROGRESS key) and CompletedAt (COMPLETED, complete, get): Unix ns.
	LeaseExpires int64
	CompletedAt  int64
	// Replay: the canonical stored response a COMPLETED reserve or get
	// carried.
	Replay string
}

func (o Op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d c%d %s %s owner=%s", o.ID, o.Client, o.Kind, o.Key, short(o.Owner))
	if o.Kind == Reserve && o.Fingerprint != "" {
		fmt.Fprintf(&b, " fp=%s", o.Fingerprint)
	}
	ret := "inf"
	if o.Return != Infinity {
		ret = fmt.Sprintf("%.3fs", float64(o.Return)/1e9)
	}
	fmt.Fprintf(&b, " [%.3fs..%s] -> %s", float64(o.Call)/1e9, ret, o.Result)
	if o.Outcome != "" {
		fmt.Fprintf(&b, " %s", o.Outcome)
	}
	if o.Fencing != 0 {
		fmt.Fprintf(&b, " fencing=%d", o.Fencing)
	}
	if o.PrevFencing != 0 {
		fmt.Fprintf(&b, " prev=%d", o.PrevFencing)
	}
	if o.LeaseExpires != 0 {
		fmt.Fprintf(&b, " lease_end=%s", time.Unix(0, o.LeaseExpires).UTC().Format("15:04:05.000"))
	}
	if o.Replay != "" {
		fmt.Fprintf(&b, " replay=%q", trim(o.Replay))
	}
	if o.Kind == Complete {
		fmt.Fprintf(&b, " response=%q", trim(o.Response))
	}
	if o.Err != "" {
		fmt.Fprintf(&b, " err=%q", trim(o.Err))
	}
	return b.String()
}

func short(s string) string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Recorder collects Ops from many goroutines.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
	max   int
	drop  int
}

// NewRecorder returns a Recorder whose times count from start and that keeps
// at most max ops (0: unlimited); past it, ops are counted as dropped.
func NewRecorder(start time.Time, max int) *Recorder {
	return &Recorder{start: start, max: max}
}

// Now returns the current time on the recorder's clock.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Start returns the recorder's time origin.
func (r *Recorder) Start() time.Time { return r.start }

// Add records op (its ID is assigned) and returns the ID, or -1 when the
// recorder is full.
func (r *Recorder) Add(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.max > 0 && len(r.ops) >= r.max {
		r.drop++
		return -1
	}
	if op.Result == Unknown {
		op.Return = Infinity
	}
	op.ID = len(r.ops)
	r.ops = append(r.ops, op)
	return op.ID
}

// Ops returns a copy of every op, in the order they were added.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// Dropped returns how many ops did not fit.
func (r *Recorder) Dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drop
}

// ByKey groups ops by key, each group sorted by call time.
func ByKey(ops []Op) map[string][]Op {
	out := map[string][]Op{}
	for _, o := range ops {
		out[o.Key] = append(out[o.Key], o)
	}
	for _, g := range out {
		sort.SliceStable(g, func(i, j int) bool { return g[i].Call < g[j].Call })
	}
	return out
}

// Len returns how many ops were recorded.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops)
}
