package fsm

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"maps"
	"sync"
)

// Errors of package fsm. Outcomes of commands are values (Result.Outcome);
// errors are reserved for bytes that cannot be decoded.
var (
	// ErrCorrupt: an encoded command or snapshot is truncated, malformed, of
	// an unknown version, or fails its checksum.
	ErrCorrupt = errors.New("fsm: corrupt data")
)

// MaxRetryAfter caps the IN_PROGRESS retry hint: a waiting caller asks again
// at least this often even when the owner's lease is long.
const MaxRetryAfter int64 = 1e9

// recordOverhead approximates the bytes a record costs beyond its strings and
// response: the Record struct, the map entry, the heap or set entry and the
// allocator's rounding (calibrated by BenchmarkRetainedRecordMemory).
const recordOverhead = 450

// FSM is the idempotency state machine of one shard. Apply is deterministic:
// replicas that apply the same commands at the same indexes hold the same
// state, byte for byte. It is safe for one writer (Apply, Restore) and many
// concurrent readers (Get, Stats, Snapshot).
type FSM struct {
	mu sync.RWMutex

	store Store
	// clock is the highest command time applied: the FSM's notion of now
	// never runs backwards, whatever the proposers' clocks do.
	clock int64
	// lastIndex is the highest fencing-token slot issued (see tokenSlot):
	// every command takes one, and slots strictly increase. Before the first
	// packed entry a slot is the command's log index, hence the name; the
	// index of the last entry applied is always entryOf(lastIndex).
	lastIndex uint64

	// Derived indexes, rebuilt on Restore, never snapshotted.
	inProgress map[RecordKey]struct{}
	expiry     expiryHeap
	bytes      int64

	// onApply observes every entry ApplyEntry applied (OnApply).
	onApply func(cmd *Command, res Result)
}

// New returns an empty FSM over an in-memory store.
func New() *FSM { return NewWithStore(NewMemStore()) }

// NewWithStore returns an FSM over s, which must be empty.
func NewWithStore(s Store) *FSM {
	if s.Len() != 0 {
		panic("fsm: NewWithStore needs an empty store")
	}
	return &FSM{store: s, inProgress: make(map[RecordKey]struct{})}
}

// ApplyEntry decodes and applies one log entry. Bytes that do not decode
// give OutcomeInvalid on every replica alike (and still advance the index).
func (f *FSM) ApplyEntry(index uint64, data []byte) Result {
	cmd, err := DecodeCommand(data)
	if err != nil {
		cmd = &Command{} // Op 0: invalid, but the index still advances.
	}
	res := f.Apply(index, cmd)
	if f.onApply != nil {
		f.onApply(cmd, res)
	}
	return res
}

// OnApply sets fn to be called, outside the FSM's lock, with each command
// ApplyEntry applied and its result: the node wakes waiting reserves with
// it. fn must not block and must not change anything the FSM decides; set it
// before the first entry is applied.
func (f *FSM) OnApply(fn func(cmd *Command, res Result)) { f.onApply = fn }

// Apply applies cmd as the log entry at index. index must be greater than
// every index applied before; the entry's fencing-token slot (tokenSlot) is
// the fencing token of an acquisition.
func (f *FSM) Apply(index uint64, cmd *Command) Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enterEntry(index)
	return f.applyAt(f.tokenSlot(index, 0, false), cmd)
}

// ApplyPackedEntry applies a packed entry (EncodePacked) at index: its
// commands in order, command i with fencing-token slot index<<16 | i. Bytes
// that do not decode count as one invalid command; a command that does not
// decode is invalid, and the others still apply. One Result per command.
func (f *FSM) ApplyPackedEntry(index uint64, data []byte) []Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enterEntry(index)
	raw, err := DecodePacked(data)
	if err != nil {
		return []Result{f.applyAt(f.tokenSlot(index, 0, true), &Command{})}
	}
	out := make([]Result, len(raw))
	for i, b := range raw {
		cmd, err := DecodeCommand(b)
		if err != nil {
			cmd = &Command{}
		}
		out[i] = f.applyAt(f.tokenSlot(index, i, true), cmd)
	}
	return out
}

func (f *FSM) enterEntry(index uint64) {
	if last := entryOf(f.lastIndex); index <= last {
		panic(fmt.Sprintf("fsm: log index %d applied after index %d: fencing tokens would repeat", index, last))
	}
	if index >= 1<<maxIndexBits {
		panic(fmt.Sprintf("fsm: log index %d leaves no room for fencing-token positions", index))
	}
}

// Fencing-token slots of packed mode: packedSlotMark | index<<16 | position.
const (
	tokenPositionBits = 16      // a command's position within its entry
	maxIndexBits      = 46      // log indexes below 2^46 (7e13 entries)
	packedSlotMark    = 1 << 62 // set in every packed-mode slot; tokens still fit an int64
)

// MaxPackedCommands is the most commands one packed entry may carry.
const MaxPackedCommands = 1 << tokenPositionBits

// entryOf is the log index of the entry that took slot.
func entryOf(slot uint64) uint64 {
	if slot&packedSlotMark == 0 {
		return slot
	}
	return (slot &^ packedSlotMark) >> tokenPositionBits
}

// tokenSlot is the fencing-token slot of command pos of the entry at index,
// the scheme that lets one Raft entry carry many commands (raftstore
// DESIGN.md, "Many commands per entry"):
//
//   - until the first packed entry, a single-command entry's slot is its
//     index, exactly as before packing existed, so an old log replays to
//     the same tokens;
//   - from the first packed entry on, every command's slot (packed or not)
//     is packedSlotMark | index<<16 | pos.
//
// Every packed-mode slot is above every index (2^62 > 2^46), and within a
// mode slots grow with (index, pos), so each slot exceeds every slot issued
// before (checked): tokens strictly increase per key and overall, across
// the switch, and across a leader that packs followed by one that does not.
// The mode is read off lastIndex, which snapshots carry, so replicas agree.
func (f *FSM) tokenSlot(index uint64, pos int, packed bool) uint64 {
	slot := index
	if packed || f.lastIndex&packedSlotMark != 0 {
		slot = packedSlotMark | index<<tokenPositionBits | uint64(pos)
	}
	if slot <= f.lastIndex {
		panic(fmt.Sprintf("fsm: fencing-token slot %d (index %d, position %d) would not exceed %d", slot, index, pos, f.lastIndex))
	}
	f.lastIndex = slot
	return slot
}

// applyAt applies cmd with fencing-token slot token; f.mu is held.
func (f *FSM) applyAt(index uint64, cmd *Command) Result {
	if cmd.Now > f.clock {
		f.clock = cmd.Now
	}
	now := f.clock

	if !valid(cmd) {
		return Result{Outcome: OutcomeInvalid}
	}
	switch cmd.Op {
	case OpReserve:
		return f.reserve(index, now, cmd)
	case OpHeartbeat:
		return f.heartbeat(now, cmd)
	case OpComplete:
		return f.complete(now, cmd)
	case OpRelease:
		return f.release(now, cmd)
	case OpSweep:
		return f.sweep(now, cmd)
	case OpForceRelease:
		return f.forceRelease(now, cmd)
	case OpDelete:
		return f.delete(now, cmd)
	}
	return Result{Outcome: OutcomeInvalid}
}

// valid checks what the proposer must guarantee. User input is validated by
// the API long before; this keeps a buggy proposer from corrupting state.
func valid(cmd *Command) bool {
	if cmd.Op == OpSweep {
		return cmd.AbandonAfter >= 0 && cmd.MaxSweep >= 0
	}
	if cmd.Namespace == "" || cmd.Key == "" {
		return false
	}
	if cmd.Op == OpForceRelease || cmd.Op == OpDelete {
		return true
	}
	if cmd.OwnerToken == "" {
		return false
	}
	switch cmd.Op {
	case OpReserve:
		return cmd.Lease > 0 && cmd.SkewMargin >= 0
	case OpHeartbeat:
		return cmd.Lease > 0
	case OpComplete:
		return cmd.Response != nil && cmd.Retention > 0
	case OpRelease:
		return true
	}
	return false
}

// live returns the record at k unless it is absent or past retention.
func (f *FSM) live(k RecordKey, now int64) (*Record, bool) {
	rec, ok := f.store.Get(k)
	if !ok || (rec.State == StateCompleted && rec.ExpiresAt <= now) {
		return nil, false
	}
	return rec, true
}

func (f *FSM) reserve(index uint64, now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	rec, ok := f.live(k, now)
	if !ok {
		return f.acquire(k, index, now, cmd, 0)
	}
	if rec.Fingerprint != cmd.Fingerprint {
		return Result{Outcome: OutcomeFingerprintMismatch}
	}
	if rec.State == StateCompleted {
		return Result{
			Outcome:      OutcomeCompleted,
			FencingToken: rec.FencingToken,
			CompletedAt:  rec.CompletedAt,
			ExpiresAt:    rec.ExpiresAt,
			Response:     rec.Response,
		}
	}
	if rec.OwnerToken == cmd.OwnerToken {
		// The same owner asking again (its answer was lost): the same
		// reservation, lease renewed, and the same outcome as the first time.
		renewed := *rec
		renewed.LeaseExpiresAt = now + cmd.Lease
		f.put(k, rec, &renewed)
		return acquiredResult(&renewed)
	}
	reclaimAt := reclaimTime(rec, cmd.SkewMargin)
	if now < reclaimAt {
		return Result{
			Outcome:        OutcomeInProgress,
			LeaseExpiresAt: rec.LeaseExpiresAt,
			RetryAfter:     min(reclaimAt-now, MaxRetryAfter),
		}
	}
	return f.acquire(k, index, now, cmd, rec.FencingToken)
}

// acquire gives k to cmd's owner with fencing token index; previous is the
// fencing token of the owner it reclaims from (0 for a fresh acquisition).
func (f *FSM) acquire(k RecordKey, index uint64, now int64, cmd *Command, previous uint64) Result {
	old, _ := f.store.Get(k)
	if old != nil && index <= old.FencingToken {
		panic(fmt.Sprintf("fsm: fencing token %d for %q would not exceed %d", index, k.Key, old.FencingToken))
	}
	rec := &Record{
		State:                StateInProgress,
		Fingerprint:          cmd.Fingerprint,
		OwnerToken:           cmd.OwnerToken,
		FencingToken:         index,
		PreviousFencingToken: previous,
		LeaseExpiresAt:       now + cmd.Lease,
		CreatedAt:            now,
	}
	f.put(k, old, rec)
	return acquiredResult(rec)
}

func acquiredResult(rec *Record) Result {
	r := Result{
		Outcome:              OutcomeAcquired,
		OwnerToken:           rec.OwnerToken,
		FencingToken:         rec.FencingToken,
		PreviousFencingToken: rec.PreviousFencingToken,
		LeaseExpiresAt:       rec.LeaseExpiresAt,
	}
	if rec.PreviousFencingToken != 0 {
		r.Outcome = OutcomeReclaimed
	}
	return r
}

func (f *FSM) heartbeat(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	rec, ok := f.live(k, now)
	if !ok || rec.State != StateInProgress || rec.OwnerToken != cmd.OwnerToken {
		return Result{Outcome: OutcomeNotOwner}
	}
	renewed := *rec
	renewed.LeaseExpiresAt = now + cmd.Lease
	f.put(k, rec, &renewed)
	return Result{Outcome: OutcomeOK, FencingToken: rec.FencingToken, LeaseExpiresAt: renewed.LeaseExpiresAt}
}

func (f *FSM) complete(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	rec, ok := f.live(k, now)
	if !ok || rec.OwnerToken != cmd.OwnerToken {
		return Result{Outcome: OutcomeNotOwner}
	}
	if rec.State == StateCompleted {
		// A retried complete whose first answer was lost: same answer.
		if !sameResponse(rec.Response, cmd.Response) {
			return Result{Outcome: OutcomeNotOwner}
		}
		return Result{Outcome: OutcomeOK, FencingToken: rec.FencingToken, CompletedAt: rec.CompletedAt, ExpiresAt: rec.ExpiresAt}
	}
	done := *rec
	done.State = StateCompleted
	done.LeaseExpiresAt = 0
	done.CompletedAt = now
	done.ExpiresAt = now + cmd.Retention
	done.Response = cloneResponse(cmd.Response)
	f.put(k, rec, &done)
	return Result{Outcome: OutcomeOK, FencingToken: done.FencingToken, CompletedAt: done.CompletedAt, ExpiresAt: done.ExpiresAt}
}

func (f *FSM) release(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	rec, ok := f.live(k, now)
	if !ok || rec.State != StateInProgress || rec.OwnerToken != cmd.OwnerToken {
		return Result{Outcome: OutcomeNotOwner}
	}
	f.put(k, rec, nil)
	return Result{Outcome: OutcomeOK}
}

// sweep drops completed records past retention (oldest first, at most
// MaxSweep) and reservations whose lease ended more than AbandonAfter ago.
func (f *FSM) sweep(now int64, cmd *Command) Result {
	swept := 0
	for len(f.expiry) > 0 && f.expiry[0].at <= now && (cmd.MaxSweep == 0 || swept < cmd.MaxSweep) {
		e := heap.Pop(&f.expiry).(expiryEntry)
		rec, ok := f.store.Get(e.k)
		if !ok || rec.State != StateCompleted || rec.ExpiresAt != e.at {
			continue // stale entry: the record changed since
		}
		f.put(e.k, rec, nil)
		swept++
	}
	if cmd.AbandonAfter > 0 {
		var abandoned []RecordKey
		for k := range f.inProgress {
			if rec, _ := f.store.Get(k); rec.LeaseExpiresAt <= now-cmd.AbandonAfter {
				abandoned = append(abandoned, k)
			}
		}
		for _, k := range abandoned { // every one goes, so map order does not matter
			rec, _ := f.store.Get(k)
			f.put(k, rec, nil)
			swept++
		}
	}
	return Result{Outcome: OutcomeOK, Swept: swept}
}

// put replaces old (nil if absent) at k with rec (nil deletes) and keeps the
// derived indexes and byte count in step.
func (f *FSM) put(k RecordKey, old, rec *Record) {
	if old != nil {
		f.bytes -= recordBytes(k, old)
		if old.State == StateInProgress {
			delete(f.inProgress, k)
		}
	}
	if rec == nil {
		f.store.Delete(k)
		return
	}
	f.store.Put(k, rec)
	f.index(k, rec)
}

func (f *FSM) index(k RecordKey, rec *Record) {
	f.bytes += recordBytes(k, rec)
	switch rec.State {
	case StateInProgress:
		f.inProgress[k] = struct{}{}
	case StateCompleted:
		heap.Push(&f.expiry, expiryEntry{at: rec.ExpiresAt, k: k})
	}
}

func recordBytes(k RecordKey, r *Record) int64 {
	n := recordOverhead + len(k.Namespace) + len(k.Key) + len(r.Fingerprint) + len(r.OwnerToken)
	if r.Response != nil {
		n += responseSize(r.Response)
	}
	return int64(n)
}

func sameResponse(a, b *Response) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) && maps.Equal(a.Headers, b.Headers)
}

func cloneResponse(r *Response) *Response {
	c := &Response{Status: r.Status, Headers: maps.Clone(r.Headers)}
	if len(r.Body) > 0 {
		c.Body = bytes.Clone(r.Body)
	}
	return c
}

// Get returns the record at (namespace, key) as of now (Unix nanoseconds;
// the FSM's own clock if that is later), or false when it is absent or past
// retention. The returned Response is shared and must not be modified.
func (f *FSM) Get(namespace, key string, now int64) (Record, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	rec, ok := f.live(RecordKey{namespace, key}, max(now, f.clock))
	if !ok {
		return Record{}, false
	}
	return *rec, true
}

// Stats are the FSM's figures for metrics and status pages.
type Stats struct {
	Records    int
	InProgress int
	Completed  int
	// Bytes approximates the memory the records take.
	Bytes int64
	// Clock is the highest command time applied (Unix nanoseconds).
	Clock     int64
	LastIndex uint64
}

// Stats returns the current figures.
func (f *FSM) Stats() Stats {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := f.store.Len()
	return Stats{
		Records:    n,
		InProgress: len(f.inProgress),
		Completed:  n - len(f.inProgress),
		Bytes:      f.bytes,
		Clock:      f.clock,
		LastIndex:  f.lastIndex,
	}
}
