package check

import (
	"fmt"
	"sort"
	"strings"

	"github.com/idem-dev/idem/regionsim/history"
	"github.com/idem-dev/idem/regionsim/ledger"
)

// Names of the checks, as the report shows them.
const (
	CheckExactlyOnce  = "exactly-once side effects"
	CheckReplays      = "replays identical to the first response"
	CheckLinearizable = "per-key linearizability (porcupine)"
	CheckNoLoss       = "no acknowledged completion lost"
)

// MaxExamples bounds the findings an Outcome keeps in full; the count goes on.
const MaxExamples = 20

// Finding is one violation.
type Finding struct {
	Key    string `json:"key"`
	Detail string `json:"detail"`
}

// Outcome is the result of one check.
type Outcome struct {
	Check string `json:"check"`
	// Checked counts what was checked (keys, responses, completions).
	Checked int `json:"checked"`
	// Violations counts every finding; Findings keeps the first MaxExamples.
	Violations int       `json:"violations"`
	Findings   []Finding `json:"findings,omitempty"`
	// Inconclusive counts what could not be decided (a linearizability
	// search that ran out of time); never a pass or a failure.
	Inconclusive int `json:"inconclusive,omitempty"`
}

// Passed reports whether the check found no violation.
func (o Outcome) Passed() bool { return o.Violations == 0 }

func (o *Outcome) add(key, format string, args ...any) {
	o.Violations++
	if len(o.Findings) < MaxExamples {
		o.Findings = append(o.Findings, Finding{Key: key, Detail: fmt.Sprintf(format, args...)})
	}
}

func (o Outcome) String() string {
	verdict := "PASS"
	if !o.Passed() {
		verdict = "FAIL"
	}
	s := fmt.Sprintf("%s %s: %d checked, %d violations", verdict, o.Check, o.Checked, o.Violations)
	if o.Inconclusive > 0 {
		s += fmt.Sprintf(", %d inconclusive", o.Inconclusive)
	}
	return s
}

// Completion is a completion the store acknowledged (or, for a system
// without a store of its own, a response the client was given as final).
type Completion struct {
	Key      string `json:"key"`
	Response string `json:"response"`  // canonical form of the stored response
	ChargeID string `json:"charge_id"` // the ledger charge the response stands for
}

// ExactlyOnce checks the ledger against the acknowledged completions: no key
// was charged twice, and every completed key was charged exactly once, by
// the charge its response names.
func ExactlyOnce(charges map[string][]ledger.Charge, acked []Completion) Outcome {
	out := Outcome{Check: CheckExactlyOnce}
	keys := make([]string, 0, len(charges))
	for k := range charges {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out.Checked++
		if cs := charges[k]; len(cs) > 1 {
			ids := make([]string, len(cs))
			for i, c := range cs {
				ids[i] = fmt.Sprintf("%s (token %d, by %s)", c.ID, c.Token, c.By)
			}
			out.add(k, "charged %d times: %s", len(cs), strings.Join(ids, ", "))
		}
	}
	seen := map[string]bool{}
	for _, c := range acked {
		if seen[c.Key] {
			continue
		}
		seen[c.Key] = true
		cs := charges[c.Key]
		switch {
		case len(cs) == 0:
			out.Checked++
			out.add(c.Key, "completed with charge %s but the ledger has no charge for it", c.ChargeID)
		case len(cs) == 1 && c.ChargeID != "" && cs[0].ID != c.ChargeID:
			out.add(c.Key, "completed naming charge %s but the ledger's only charge is %s", c.ChargeID, cs[0].ID)
		}
	}
	return out
}

// Delivery is a response a client received for a key: the first run's or a
// replay.
type Delivery struct {
	Key      string `json:"key"`
	Response string `json:"response"`
	Replayed bool   `json:"replayed"`
	At       int64  `json:"at"` // ns since the run started
}

// Replays checks that every response clients received for a key is
// identical, byte for byte, to the first one, and that every replay the
// store answered (COMPLETED reserves and gets in ops) equals the response
// its owner stored.
func Replays(deliveries []Delivery, ops []history.Op) Outcome {
	out := Outcome{Check: CheckReplays}
	first := map[string]Delivery{}
	sorted := append([]Delivery(nil), deliveries...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].At < sorted[j].At })
	for _, d := range sorted {
		out.Checked++
		f, ok := first[d.Key]
		if !ok {
			first[d.Key] = d
			continue
		}
		if d.Response != f.Response {
			out.add(d.Key, "client received %q (replayed=%v) after %q", trim(d.Response), d.Replayed, trim(f.Response))
		}
	}
	stored := map[string]string{} // key -> the response a successful complete stored
	for _, op := range ops {
		if op.Kind == history.Complete && op.Result == history.OK {
			if prev, ok := stored[op.Key]; ok && prev != op.Response {
				out.add(op.Key, "two completes succeeded with different responses: %q and %q", trim(prev), trim(op.Response))
			}
			stored[op.Key] = op.Response
		}
	}
	for _, op := range ops {
		if op.Result != history.OK || op.Outcome != history.Completed || (op.Kind != history.Reserve && op.Kind != history.Get) {
			continue
		}
		out.Checked++
		if s, ok := stored[op.Key]; ok && s != op.Replay {
			out.add(op.Key, "%s replayed %q, but the owner stored %q", op.Kind, trim(op.Replay), trim(s))
		}
	}
	return out
}

// FinalRead is what a read of a key at the end of the run found.
type FinalRead struct {
	Found    bool
	Response string
	Err      string // the read failed: no answer
}

// NoLoss checks that every acknowledged completion is still there at the
// end, with the same response.
func NoLoss(acked []Completion, final map[string]FinalRead) Outcome {
	out := Outcome{Check: CheckNoLoss}
	seen := map[string]bool{}
	for _, c := range acked {
		if seen[c.Key] {
			continue
		}
		seen[c.Key] = true
		out.Checked++
		r, ok := final[c.Key]
		switch {
		case !ok || r.Err != "":
			// No answer proves nothing either way.
			out.Inconclusive++
		case !r.Found:
			out.add(c.Key, "acknowledged completion is gone (not found)")
		case r.Response != c.Response:
			out.add(c.Key, "acknowledged completion changed: stored %q, now %q", trim(c.Response), trim(r.Response))
		}
	}
	return out
}
