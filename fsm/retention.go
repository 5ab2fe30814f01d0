package fsm

import (
	"bytes"
	"math"
)

// Tombstones, namespace policies and checkpoints (API v1.2). See DESIGN.md,
// "Tombstones, policies and checkpoints".

// tombstoneOf is the tombstone the COMPLETED record rec leaves when its
// retention ends, under the namespace's policy p: its fingerprint, fencing
// token and times, no owner, response or checkpoint, kept for
// p.TombstoneFor() after the response expired. false when p keeps none.
func tombstoneOf(rec *Record, p Policy) (*Record, bool) {
	keep := p.TombstoneFor()
	if keep <= 0 {
		return nil, false
	}
	return &Record{
		State:        StateExpired,
		Fingerprint:  rec.Fingerprint,
		FencingToken: rec.FencingToken,
		CompletedAt:  rec.CompletedAt,
		ExpiredAt:    rec.ExpiresAt,
		ExpiresAt:    rec.ExpiresAt + keep,
	}, true
}

// sweepExpired turns up to limit COMPLETED records past retention into
// tombstones (or drops them when their namespace keeps none, or when the
// tombstone would already be over) and drops tombstones past their end, in
// the store's (ExpiresAt, key) order, so every replica does the same.
func (f *FSM) sweepExpired(now int64, limit int) int {
	expired := f.store.Expired(now, limit)
	for _, e := range expired {
		if e.R.State == StateCompleted {
			if tomb, ok := tombstoneOf(e.R, f.policies[e.K.Namespace]); ok && tomb.ExpiresAt > now {
				f.put(e.K, e.R, tomb)
				continue
			}
		}
		f.put(e.K, e.R, nil)
	}
	return len(expired)
}

// resolve is the lease or retention a command gets under its namespace's
// policy: a value the caller left to the default (isDefault; value is the
// built-in default) becomes the policy's default, capped by its max; a
// value the caller asked for above the policy's max is LIMIT_EXCEEDED
// (limit names it; unit converts the max to the limit's unit).
func resolve(value int64, isDefault bool, policyDefault, policyMax int64, limit string, unit int64) (int64, *Result) {
	if isDefault {
		if policyDefault > 0 {
			value = policyDefault
		}
		if policyMax > 0 && value > policyMax {
			value = policyMax
		}
		return value, nil
	}
	if policyMax > 0 && value > policyMax {
		return 0, &Result{Outcome: OutcomeLimitExceeded, Limit: limit, LimitValue: policyMax / unit}
	}
	return value, nil
}

// validPolicy checks what the proposer must guarantee of a policy: no
// negative value, defaults within their max.
func validPolicy(p Policy) bool {
	if p.DefaultLease < 0 || p.MaxLease < 0 || p.DefaultRetention < 0 || p.MaxRetention < 0 || p.Tombstone < 0 {
		return false
	}
	if p.MaxLease > 0 && p.DefaultLease > p.MaxLease {
		return false
	}
	if p.MaxRetention > 0 && p.DefaultRetention > p.MaxRetention {
		return false
	}
	return p.TombstoneSet || p.Tombstone == 0
}

// setPolicy stores cmd.Policy as the policy of cmd.Namespace: a
// StatePolicy record (so snapshots and the disk store keep it like any
// record; it never expires) and the in-memory copy.
func (f *FSM) setPolicy(cmd *Command) Result {
	k := RecordKey{PolicyNamespace, cmd.Namespace}
	old, ok := f.store.Get(k)
	if !ok {
		old = nil
	}
	p := *cmd.Policy
	f.put(k, old, &Record{State: StatePolicy, ExpiresAt: math.MaxInt64, Policy: &p})
	f.policies[cmd.Namespace] = p
	return Result{Outcome: OutcomeOK, Policy: &p}
}

// loadPolicies reads the policy records of s.
func loadPolicies(s Store) map[string]Policy {
	out := make(map[string]Policy)
	err := s.Scan(PolicyNamespace, "", func(ns string, r *Record) bool {
		if r.State == StatePolicy && r.Policy != nil {
			out[ns] = *r.Policy
		}
		return true
	})
	if err != nil {
		panic("fsm: reading the namespace policies: " + err.Error())
	}
	return out
}

// Policy returns the policy stored for namespace (false: none; the
// built-in defaults apply).
func (f *FSM) Policy(namespace string) (Policy, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.policies[namespace]
	return p, ok
}

// checkpoint stores cmd.Checkpoint on the key while cmd's owner holds it
// (even past its lease, if nobody reclaimed it), replacing the previous
// one. A complete or release drops it; a reclaim carries it to the next
// attempt.
func (f *FSM) checkpoint(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	rec, ok := f.live(k, now)
	if !ok || rec.State != StateInProgress || rec.OwnerToken != cmd.OwnerToken {
		return Result{Outcome: OutcomeNotOwner}
	}
	next := *rec
	next.Checkpoint = &Checkpoint{
		Name:         cmd.Checkpoint.Name,
		Data:         bytes.Clone(cmd.Checkpoint.Data),
		FencingToken: rec.FencingToken,
		At:           now,
	}
	f.put(k, rec, &next)
	return Result{Outcome: OutcomeOK, FencingToken: rec.FencingToken, Checkpoint: next.Checkpoint}
}
