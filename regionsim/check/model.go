package check

import (
	"context"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idem-dev/idem/regionsim/history"
)

// The model of one key, as the contract describes it. Simplifications (all
// make the model more permissive, never stricter than the contract):
//
//   - Time enters only through what the store answered. A reserve's
//     server time is its lease_expires_at minus its lease_ms, so a RECLAIMED
//     must satisfy serverNow >= the previous lease end + the clock-skew
//     margin, both on the store's (monotonic per shard) clock. An
//     IN_PROGRESS answer is not checked against time (the store may answer
//     it until the reclaim moment, and the answer does not carry the
//     store's time exactly).
//   - A call whose answer was lost (timeout, UNAVAILABLE) may take effect at
//     any point after it was made, or never (porcupine sees it with an
//     infinite return time and the model lets it apply or not). Values it
//     would have returned (fencing token, lease end, completion time) are
//     unknown until a later answer shows them; the model then pins them.
//   - Retention and the sweep are not modelled: runs are far shorter than
//     the retention (24 h) and the abandon-after time (7 days).
const (
	absent uint8 = iota
	inProgress
	completed
)

// keyState is the model's state of one key. Zero fencing, lease or
// completion time means "unknown" (the value came from a call whose answer
// was lost); real fencing tokens start at 1.
type keyState struct {
	status      uint8
	owner       string
	fp          string
	fencing     uint64
	reclaimed   bool
	prev        uint64
	leaseExp    int64
	maxFencing  uint64 // highest fencing token the key gave out before the current owner
	resp        string
	completedAt int64
}

func (s keyState) String() string {
	switch s.status {
	case absent:
		return fmt.Sprintf("absent(max=%d)", s.maxFencing)
	case inProgress:
		return fmt.Sprintf("in_progress(owner=%s f=%d reclaimed=%v lease_end=%d)", short(s.owner), s.fencing, s.reclaimed, s.leaseExp)
	}
	return fmt.Sprintf("completed(owner=%s f=%d resp=%q)", short(s.owner), s.fencing, trim(s.resp))
}

func short(s string) string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

func trim(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

// pin returns known unless it is zero (unknown), in which case observed.
// ok is false when both are known and differ.
func pinU(known, observed uint64) (uint64, bool) {
	if known == 0 {
		return observed, true
	}
	return known, known == observed
}

func pinI(known, observed int64) (int64, bool) {
	if known == 0 {
		return observed, true
	}
	return known, known == observed
}

// retire folds the current owner's fencing token into maxFencing.
func (s keyState) retire() keyState {
	s.maxFencing = max(s.maxFencing, s.fencing)
	return s
}

// stepper holds the model's parameters.
type stepper struct {
	margin int64 // the store's clock-skew margin, ns
}

func leaseNs(op history.Op) int64 {
	if op.LeaseMs <= 0 {
		return 30000 * int64(time.Millisecond)
	}
	return op.LeaseMs * int64(time.Millisecond)
}

// step returns every state s may move to when op is applied to it with the
// recorded answer; none when the answer is impossible from s.
func (m stepper) step(s keyState, op history.Op) []keyState {
	if op.Result == history.Unknown {
		return m.stepUnknown(s, op)
	}
	switch op.Kind {
	case history.Reserve:
		if next, ok := m.reserve(s, op); ok {
			return []keyState{next}
		}
	case history.Heartbeat:
		owns := s.status == inProgress && s.owner == op.Owner
		switch {
		case op.Result == history.OK && owns:
			s.leaseExp = op.LeaseExpires
			return []keyState{s}
		case op.Result == history.NotOwner && !owns:
			return []keyState{s}
		}
	case history.Complete:
		owns := s.status == inProgress && s.owner == op.Owner
		repeat := s.status == completed && s.owner == op.Owner && s.resp == op.Response
		switch {
		case op.Result == history.OK && owns:
			s.status, s.resp, s.completedAt, s.leaseExp = completed, op.Response, op.CompletedAt, 0
			return []keyState{s}
		case op.Result == history.OK && repeat:
			var ok bool
			if s.completedAt, ok = pinI(s.completedAt, op.CompletedAt); ok {
				return []keyState{s}
			}
		case op.Result == history.NotOwner && !owns && !repeat:
			return []keyState{s}
		}
	case history.Release:
		owns := s.status == inProgress && s.owner == op.Owner
		switch {
		case op.Result == history.OK && owns:
			return []keyState{{status: absent, maxFencing: s.retire().maxFencing}}
		case op.Result == history.NotOwner && !owns:
			return []keyState{s}
		}
	case history.Checkpoint:
		// Allowed while the caller owns the key; it changes no ownership.
		owns := s.status == inProgress && s.owner == op.Owner
		if op.Result == history.OK && owns || op.Result == history.NotOwner && !owns {
			return []keyState{s}
		}
	case history.Get:
		if next, ok := m.get(s, op); ok {
			return []keyState{next}
		}
	}
	return nil
}

func (m stepper) reserve(s keyState, op history.Op) (keyState, bool) {
	if op.Result != history.OK {
		return s, false
	}
	if s.status != absent && s.fp != op.Fingerprint {
		return s, op.Outcome == history.FingerprintMismatch
	}
	switch op.Outcome {
	case history.Acquired, history.Reclaimed:
		reclaimed := op.Outcome == history.Reclaimed
		switch {
		case s.status == absent:
			if reclaimed || op.Fencing <= s.maxFencing {
				return s, false
			}
			return keyState{status: inProgress, owner: op.Owner, fp: op.Fingerprint, fencing: op.Fencing,
				leaseExp: op.LeaseExpires, maxFencing: s.maxFencing}, true
		case s.status == inProgress && s.owner == op.Owner:
			// The same owner again: the same reservation, lease renewed.
			if reclaimed != s.reclaimed {
				return s, false
			}
			var ok1, ok2 bool
			s.fencing, ok1 = pinU(s.fencing, op.Fencing)
			ok2 = true
			if reclaimed {
				s.prev, ok2 = pinU(s.prev, op.PrevFencing)
			}
			s.leaseExp = op.LeaseExpires
			return s, ok1 && ok2 && s.fencing > s.maxFencing
		case s.status == inProgress:
			if !reclaimed {
				return s, false
			}
			if s.fencing != 0 && op.PrevFencing != s.fencing {
				return s, false
			}
			prior := s.retire().maxFencing
			if s.fencing == 0 {
				prior = max(prior, op.PrevFencing)
			}
			if op.Fencing <= prior {
				return s, false
			}
			serverNow := op.LeaseExpires - leaseNs(op)
			if s.leaseExp != 0 && serverNow < s.leaseExp+m.margin {
				return s, false // reclaimed before lease end + margin
			}
			return keyState{status: inProgress, owner: op.Owner, fp: op.Fingerprint, fencing: op.Fencing,
				reclaimed: true, prev: op.PrevFencing, leaseExp: op.LeaseExpires, maxFencing: prior}, true
		}
		return s, false
	case history.InProgress:
		if s.status != inProgress || s.owner == op.Owner {
			return s, false
		}
		var ok bool
		s.leaseExp, ok = pinI(s.leaseExp, op.LeaseExpires)
		return s, ok
	case history.Completed:
		if s.status != completed || op.Replay != s.resp {
			return s, false
		}
		var ok1, ok2 bool
		s.fencing, ok1 = pinU(s.fencing, op.Fencing)
		s.completedAt, ok2 = pinI(s.completedAt, op.CompletedAt)
		return s, ok1 && ok2
	}
	return s, false
}

func (m stepper) get(s keyState, op history.Op) (keyState, bool) {
	switch {
	case op.Result == history.NotFound:
		return s, s.status == absent
	case op.Result != history.OK:
		return s, false
	case op.Outcome == history.InProgress && s.status == inProgress:
		var ok1, ok2 bool
		s.fencing, ok1 = pinU(s.fencing, op.Fencing)
		s.leaseExp, ok2 = pinI(s.leaseExp, op.LeaseExpires)
		return s, ok1 && ok2 && op.Fingerprint == s.fp
	case op.Outcome == history.Completed && s.status == completed:
		var ok1, ok2 bool
		s.fencing, ok1 = pinU(s.fencing, op.Fencing)
		s.completedAt, ok2 = pinI(s.completedAt, op.CompletedAt)
		return s, ok1 && ok2 && op.Replay == s.resp && op.Fingerprint == s.fp
	}
	return s, false
}

// stepUnknown: the call may not have been applied (s unchanged) or may have
// been, with whatever answer the store would have given.
func (m stepper) stepUnknown(s keyState, op history.Op) []keyState {
	out := []keyState{s}
	owns := s.status == inProgress && s.owner == op.Owner
	switch op.Kind {
	case history.Reserve:
		switch {
		case s.status == absent:
			out = append(out, keyState{status: inProgress, owner: op.Owner, fp: op.Fingerprint, maxFencing: s.maxFencing})
		case s.fp != op.Fingerprint:
		case owns:
			s.leaseExp = 0
			out = append(out, s)
		case s.status == inProgress:
			// A reclaim, if the lease had run out by then (unknown time).
			out = append(out, keyState{status: inProgress, owner: op.Owner, fp: op.Fingerprint, reclaimed: true,
				prev: s.fencing, maxFencing: s.retire().maxFencing})
		}
	case history.Heartbeat:
		if owns {
			s.leaseExp = 0
			out = append(out, s)
		}
	case history.Complete:
		if owns {
			s.status, s.resp, s.completedAt, s.leaseExp = completed, op.Response, 0, 0
			out = append(out, s)
		}
	case history.Release:
		if owns {
			out = append(out, keyState{status: absent, maxFencing: s.retire().maxFencing})
		}
	}
	return out
}

// Model returns the porcupine model of one key's history under the contract,
// for a store whose clock-skew margin is margin. Histories must be
// partitioned by key before checking (Linearizability does that).
func Model(margin time.Duration) porcupine.Model {
	m := stepper{margin: int64(margin)}
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{keyState{}} },
		Step: func(state, input, output interface{}) []interface{} {
			next := m.step(state.(keyState), input.(history.Op))
			out := make([]interface{}, len(next))
			for i, s := range next {
				out[i] = s
			}
			return out
		},
		Hash: func(state interface{}) uint64 {
			s := state.(keyState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d|%s|%d|%d|%d", s.status, s.owner, s.fencing, s.leaseExp, s.maxFencing)
			return h.Sum64()
		},
		DescribeOperation: func(input, output interface{}) string { return input.(history.Op).String() },
		DescribeState:     func(state interface{}) string { return state.(keyState).String() },
	}
	return nm.ToModel()
}

// Linearizability checks the history of every key against the model with
// porcupine. Keys are checked separately (the contract is per key); a key
// whose check runs past perKey counts as inconclusive, and once budget is
// spent the remaining keys are not checked (also inconclusive).
func Linearizability(ops []history.Op, margin time.Duration, perKey, budget time.Duration) Outcome {
	out := Outcome{Check: CheckLinearizable}
	model := Model(margin)
	byKey := history.ByKey(ops)
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	for _, k := range keys {
		var pops []porcupine.Operation
		for _, op := range byKey[k] {
			if op.Result == history.Failed {
				out.add(k, "the store answered a decided error to a valid request: %s", op)
				continue
			}
			if op.Kind == history.Get && op.Result == history.Unknown {
				continue // a lost read changes nothing
			}
			pops = append(pops, porcupine.Operation{ClientId: op.Client, Input: op, Output: op, Call: op.Call, Return: op.Return})
		}
		if len(pops) == 0 {
			continue
		}
		if ctx.Err() != nil {
			out.Inconclusive++
			continue
		}
		out.Checked++
		switch porcupine.CheckOperationsTimeout(model, pops, min(perKey, time.Until(deadline(ctx)))) {
		case porcupine.Illegal:
			out.add(k, "no linearization under the contract; history: %s", describe(byKey[k]))
		case porcupine.Unknown:
			out.Inconclusive++
		}
	}
	return out
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

func describe(ops []history.Op) string {
	const maxOps = 12
	parts := make([]string, 0, min(len(ops), maxOps))
	for i, o := range ops {
		if i == maxOps {
			parts = append(parts, fmt.Sprintf("... %d more", len(ops)-maxOps))
			break
		}
		parts = append(parts, o.String())
	}
	return strings.Join(parts, "; ")
}
