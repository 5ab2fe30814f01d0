package fsm

// The operator actions (force-release, delete) and the key listing. The
// decisions are pure functions of a Record so that they read the same
// whatever the store keeps records in.

// Released reports whether r is an IN_PROGRESS record an operator
// force-released: it has no owner (no owner token matches it) and the next
// reserve reclaims it at once.
func (r *Record) Released() bool { return r.State == StateInProgress && r.OwnerToken == "" }

// reclaimTime is when another caller may take rec: the end of the lease plus
// the clock-skew margin, or at once for a force-released record (an operator
// decided the owner is gone; no clock is involved).
func reclaimTime(rec *Record, skewMargin int64) int64 {
	if rec.Released() {
		return rec.LeaseExpiresAt
	}
	return rec.LeaseExpiresAt + skewMargin
}

// forceReleased is rec taken from its owner at now: no owner token (so the
// old owner's heartbeat, complete and release get NOT_OWNER), the lease ended
// at now at the latest. The fencing token stays, so the next reserve is
// RECLAIMED with it as previous_fencing_token and gets a larger one (its own
// log index). The record stays until it is reclaimed or swept as abandoned.
func forceReleased(rec Record, now int64) Record {
	rec.OwnerToken = ""
	rec.LeaseExpiresAt = min(rec.LeaseExpiresAt, now)
	return rec
}

// decideForceRelease is the outcome of a force-release of rec (nil:
// absent): OK for an IN_PROGRESS record (again OK, the same answer, for one
// already force-released, so that a retried action is safe), NOT_FOUND,
// or FAILED_PRECONDITION for a COMPLETED one.
func decideForceRelease(rec *Record) Outcome {
	switch {
	case rec == nil:
		return OutcomeNotFound
	case rec.State != StateInProgress:
		return OutcomeFailedPrecondition
	}
	return OutcomeOK
}

func (f *FSM) forceRelease(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	rec, ok := f.live(k, now)
	if !ok {
		rec = nil
	}
	if o := decideForceRelease(rec); o != OutcomeOK {
		return Result{Outcome: o, State: stateOf(rec)}
	}
	if !rec.Released() {
		released := forceReleased(*rec, now)
		f.put(k, rec, &released)
	}
	return Result{Outcome: OutcomeOK, PreviousFencingToken: rec.FencingToken, State: StateInProgress}
}

// delete removes the live record at the command's key. Fencing tokens stay
// strictly increasing without remembering the deleted one: a token is the
// fencing-token slot of the acquiring command (tokenSlot), and every command
// applied later in the shard takes a larger slot, whatever the key.
func (f *FSM) delete(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	rec, ok := f.live(k, now)
	if !ok {
		return Result{Outcome: OutcomeNotFound}
	}
	// rec may be the tombstone an expired record stands for (live): what
	// is deleted is the record stored.
	stored, _ := f.store.Get(k)
	f.put(k, stored, nil)
	return Result{Outcome: OutcomeOK, PreviousFencingToken: rec.FencingToken, State: rec.State}
}

func stateOf(rec *Record) State {
	if rec == nil {
		return 0
	}
	return rec.State
}

// ListQuery selects records of one namespace of one shard, in key order.
type ListQuery struct {
	Namespace string
	// After: only keys greater than this (the last key of the previous
	// page); "" starts at the beginning.
	After string
	// State: only records in this state; 0 means both.
	State State
	// CreatedBefore: only records whose current owner reserved them before
	// this time (Unix nanoseconds); 0 means any age.
	CreatedBefore int64
	// Limit is the most records returned (>= 1).
	Limit int
	// MaxScan bounds the records examined, matching or not (>= Limit), so
	// that one page holds the FSM's read lock for a bounded time however
	// few records match.
	MaxScan int
}

// ListedRecord is one record of a page, without its owner token and response.
type ListedRecord struct {
	Key    string
	Record Record
}

// ListPage is one page of a shard's records.
type ListPage struct {
	Records []ListedRecord
	// Last is the last key examined; the next page starts after it.
	Last string
	// Done: the scan reached the end of the namespace in this shard.
	Done bool
}

// matches reports whether rec, live at now, is selected by q.
func (q ListQuery) matches(rec *Record, now int64) bool {
	if rec.State != StateInProgress && rec.State != StateCompleted {
		return false // tombstones are not listed
	}
	if rec.State == StateCompleted && rec.ExpiresAt <= now {
		return false
	}
	if q.State != 0 && rec.State != q.State {
		return false
	}
	return q.CreatedBefore == 0 || rec.CreatedAt < q.CreatedBefore
}

// List returns one page of q at now (the FSM's clock if later), read from
// the store's committed state in one consistent view (Store.Scan): a single
// point of this shard's state. It examines at most q.MaxScan records, and
// takes only the read lock, so the writer goes on applying.
func (f *FSM) List(q ListQuery, now int64) (ListPage, error) {
	q.Limit = max(q.Limit, 1)
	q.MaxScan = max(q.MaxScan, q.Limit)
	f.mu.RLock()
	now = max(now, f.meta.Clock)
	f.mu.RUnlock()
	page := ListPage{Done: true}
	scanned := 0
	err := f.store.Scan(q.Namespace, q.After, func(key string, rec *Record) bool {
		if scanned == q.MaxScan || len(page.Records) == q.Limit {
			page.Done = false
			return false
		}
		scanned++
		page.Last = key
		if q.matches(rec, now) {
			listed := *rec
			listed.OwnerToken, listed.Response = "", nil
			page.Records = append(page.Records, ListedRecord{Key: key, Record: listed})
		}
		return true
	})
	if err != nil {
		return ListPage{}, err
	}
	return page, nil
}

// MaxOldestScan bounds the IN_PROGRESS records OldestInProgress examines.
const MaxOldestScan = 10000

// OldestInProgress returns the earliest CreatedAt among committed
// IN_PROGRESS records (ok=false when there is none), for the stuck-key
// metric. It examines at most MaxOldestScan records, those whose leases end
// first (a key abandoned by its owner is among them; one a live owner keeps
// renewing is found while the shard holds fewer in-flight keys than that).
func (f *FSM) OldestInProgress() (createdAt int64, ok bool, err error) {
	n := 0
	err = f.store.ScanInProgress(func(_ RecordKey, r *Record) bool {
		if !ok || r.CreatedAt < createdAt {
			createdAt, ok = r.CreatedAt, true
		}
		n++
		return n < MaxOldestScan
	})
	return createdAt, ok, err
}
