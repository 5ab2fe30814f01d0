package fsm

// RepeatedComplete answers cmd, a stamped complete, from the state when
// applying it would change nothing and answer OK: the key's partition is
// here, the key is completed by cmd's owner token with cmd's response (a
// retry whose first answer was lost, or a client repeating itself), and
// cmd's retention is one the namespace's policy takes. It returns the
// result Apply would return then, and ok; in every other case ok is false
// and cmd must go through the log. The caller reads after a read barrier
// (the leader has applied everything committed), so the answer is the one
// the log would give at that point. It reads only: a repeat costs no log
// entry, no disk write and no memory on any replica.
func (f *FSM) RepeatedComplete(cmd *Command) (Result, bool) {
	if cmd.Op != OpComplete || !valid(cmd) {
		return Result{}, false
	}
	at, ok := commandTime(cmd)
	if !ok {
		return Result{}, false
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	k := RecordKey{cmd.Namespace, cmd.Key}
	if owned, _ := f.parts.ownsKey(k); !owned {
		return Result{}, false
	}
	p := f.policies[k.Namespace]
	if _, res := resolve(cmd.Retention, cmd.RetentionIsDefault, p.DefaultRetention, p.MaxRetention, "max_retention_s", 1e9); res != nil {
		return Result{}, false
	}
	rec, found := f.store.Lookup(k)
	rec, found = liveRecord(rec, found, max(at, f.meta.Clock), p)
	if !found || rec.State != StateCompleted || rec.OwnerToken != cmd.OwnerToken || !sameResponse(rec.Response, cmd.Response) {
		return Result{}, false
	}
	return Result{Outcome: OutcomeOK, FencingToken: rec.FencingToken, CompletedAt: rec.CompletedAt, ExpiresAt: rec.ExpiresAt}, true
}
