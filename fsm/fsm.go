package fsm

import (
	"bytes"
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

// tombstoneOverhead is recordOverhead for a tombstone: no owner token,
// response or checkpoint, and one index entry like any record.
const tombstoneOverhead = 200

// FSM is the idempotency state machine of one shard. Apply is deterministic:
// replicas that apply the same commands at the same indexes hold the same
// state, byte for byte. It is safe for one writer (Apply, Restore) and many
// concurrent readers (Get, Stats, Snapshot).
type FSM struct {
	mu sync.RWMutex

	store Store
	// meta holds the clock (the highest command time applied: the FSM's
	// notion of now never runs backwards, whatever the proposers' clocks
	// do), the highest log index applied (indexes must increase) and the
	// record counts. It is handed to the store after every command.
	meta Meta

	// onApply observes every entry ApplyEntry applied (OnApply).
	onApply func(cmd *Command, res Result)

	// policies are the namespace policies the store holds (StatePolicy
	// records), kept in memory too: every reserve, complete and sweep reads
	// them, and there is one per namespace an operator configured, not
	// one per key. Loaded when the FSM opens its store and after a restore.
	policies map[string]Policy

	// parts is the group's partition table (PartitionsNamespace), kept in
	// memory: every command on a key checks it. Loaded with the policies.
	parts partTable
}

// New returns an empty FSM over an in-memory store.
func New() *FSM { return NewWithStore(NewMemStore()) }

// NewWithStore returns an FSM over s, continuing from the state s holds
// (empty, or what a disk store kept from an earlier run).
func NewWithStore(s Store) *FSM {
	f := &FSM{store: s, meta: s.Meta()}
	f.policies = loadPolicies(s)
	f.parts = loadPartTable(s)
	return f
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
// ApplyEntry or ApplyPackedEntry applied and its result: the node wakes waiting reserves with
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
	cmds, out := f.applyPacked(index, data)
	if f.onApply != nil {
		for i, cmd := range cmds {
			f.onApply(cmd, out[i])
		}
	}
	return out
}

func (f *FSM) applyPacked(index uint64, data []byte) ([]*Command, []Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enterEntry(index)
	raw, err := DecodePacked(data)
	if err != nil {
		cmd := &Command{}
		return []*Command{cmd}, []Result{f.applyAt(f.tokenSlot(index, 0, true), cmd)}
	}
	cmds := make([]*Command, len(raw))
	out := make([]Result, len(raw))
	for i, b := range raw {
		cmd, err := DecodeCommand(b)
		if err != nil {
			cmd = &Command{}
		}
		cmds[i] = cmd
		out[i] = f.applyAt(f.tokenSlot(index, i, true), cmd)
	}
	return cmds, out
}

func (f *FSM) enterEntry(index uint64) {
	if last := entryOf(f.meta.LastIndex); index <= last {
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
// The mode is read off meta.LastIndex, which snapshots and the disk store
// carry, so replicas agree.
func (f *FSM) tokenSlot(index uint64, pos int, packed bool) uint64 {
	slot := index
	if packed || f.meta.LastIndex&packedSlotMark != 0 {
		slot = packedSlotMark | index<<tokenPositionBits | uint64(pos)
	}
	if slot <= f.meta.LastIndex {
		panic(fmt.Sprintf("fsm: fencing-token slot %d (index %d, position %d) would not exceed %d", slot, index, pos, f.meta.LastIndex))
	}
	f.meta.LastIndex = slot
	return slot
}

// PackedTokens reports whether fencing-token slots are in packed mode: a
// packed entry was applied to this state (here, or before the snapshot or
// durable state it continues). Such a state can only be carried on by a
// release that reads packed entries: a release before packing takes the
// slot for a log index, so its re-apply guard would refuse (panic at) the
// next entry, and its tokens would go back below the ones issued. The node
// reads it as "packing is already on for this group" (a packed entry was
// committed, so every voter read it).
func (f *FSM) PackedTokens() bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.meta.LastIndex&packedSlotMark != 0
}

// applyAt applies cmd with fencing-token slot token; f.mu is held.
func (f *FSM) applyAt(index uint64, cmd *Command) Result {
	at, ok := commandTime(cmd)
	if !ok {
		// No quorum of clocks agrees: the command neither moves time nor
		// changes state (the node checks the same before proposing).
		return Result{Outcome: OutcomeInvalid}
	}
	if at > f.meta.Clock {
		f.meta.Clock = at
	}
	defer func() { f.store.SetMeta(f.meta) }()
	// The fencing token of an acquisition is the entry's slot raised by the
	// group's token base (handoff.go: above every token of the shards it
	// took partitions from).
	return f.apply(index+f.parts.tokenBase, f.meta.Clock, cmd)
}

func (f *FSM) apply(index uint64, now int64, cmd *Command) Result {

	if !valid(cmd) {
		return Result{Outcome: OutcomeInvalid}
	}
	if cmd.Key != "" {
		if owned, s := f.parts.ownsKey(RecordKey{cmd.Namespace, cmd.Key}); !owned {
			return movedResult(s)
		}
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
	case OpSetPolicy:
		return f.setPolicy(cmd)
	case OpCheckpoint:
		return f.checkpoint(now, cmd)
	case OpFreeze:
		return f.freeze(cmd, index)
	case OpImport:
		return f.importRecords(cmd)
	case OpOpen:
		return f.open(cmd)
	case OpDrop:
		return f.drop(cmd)
	case OpAdopt:
		return f.adopt(cmd)
	}
	return Result{Outcome: OutcomeInvalid}
}

// valid checks what the proposer must guarantee. User input is validated by
// the API long before; this keeps a buggy proposer from corrupting state.
func valid(cmd *Command) bool {
	if cmd.Op == OpSweep {
		return cmd.AbandonAfter >= 0 && cmd.MaxSweep >= 0
	}
	switch cmd.Op {
	case OpFreeze, OpImport, OpOpen, OpDrop, OpAdopt:
		return validHandoff(cmd)
	}
	if cmd.Handoff != nil {
		return false
	}
	if cmd.Op == OpSetPolicy {
		return cmd.Namespace != "" && cmd.Key == "" && cmd.Policy != nil && validPolicy(*cmd.Policy)
	}
	if cmd.Namespace == "" || cmd.Key == "" || cmd.Namespace[0] == '!' {
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
	case OpCheckpoint:
		return cmd.Checkpoint != nil && cmd.Checkpoint.Name != ""
	}
	return false
}

// live returns the record at k as of now: the stored record, the tombstone
// a COMPLETED record past retention stands for until a sweep stores it, or
// false when there is none (absent, or a tombstone past its end).
func (f *FSM) live(k RecordKey, now int64) (*Record, bool) {
	rec, ok := f.store.Get(k)
	return liveRecord(rec, ok, now, f.policies[k.Namespace])
}

// liveRecord is what the stored rec (ok: present) reads as at now, under
// the namespace's policy p. Sweeps turn expired records into tombstones a
// little later than their retention ends; until then the record reads as
// the tombstone the sweep will store, so the answer does not depend on
// when the sweep ran.
func liveRecord(rec *Record, ok bool, now int64, p Policy) (*Record, bool) {
	if !ok {
		return nil, false
	}
	switch {
	case rec.State == StateCompleted && rec.ExpiresAt <= now:
		tomb, keep := tombstoneOf(rec, p)
		if !keep || tomb.ExpiresAt <= now {
			return nil, false
		}
		return tomb, true
	case rec.State == StateExpired && rec.ExpiresAt <= now:
		return nil, false
	}
	return rec, true
}

func (f *FSM) reserve(index uint64, now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	p := f.policies[k.Namespace]
	lease, res := resolve(cmd.Lease, cmd.LeaseIsDefault, p.DefaultLease, p.MaxLease, "max_lease_ms", 1e6)
	if res != nil {
		return *res
	}
	leased := *cmd
	leased.Lease = lease
	cmd = &leased
	stored, found := f.store.Get(k)
	rec, ok := liveRecord(stored, found, now, p)
	if !ok {
		// stored may be an expired record not swept yet: acquire replaces it.
		return f.acquire(k, stored, index, now, cmd, 0)
	}
	if rec.Fingerprint != cmd.Fingerprint {
		return Result{Outcome: OutcomeFingerprintMismatch}
	}
	if rec.State == StateExpired {
		if cmd.IfExpiredAcquire {
			return f.acquire(k, stored, index, now, cmd, 0)
		}
		return Result{
			Outcome:      OutcomeExpired,
			FencingToken: rec.FencingToken,
			CompletedAt:  rec.CompletedAt,
			ExpiredAt:    rec.ExpiredAt,
		}
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
	return f.acquire(k, rec, index, now, cmd, rec.FencingToken)
}

// acquire gives k to cmd's owner with fencing token index; old is the record
// stored at k (nil: none), previous the fencing token of the owner it
// reclaims from (0 for a fresh acquisition). The caller read old: a reserve
// of a new key is a point read that misses, the most expensive read there is,
// and is done once.
func (f *FSM) acquire(k RecordKey, old *Record, index uint64, now int64, cmd *Command, previous uint64) Result {
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
	if previous != 0 && old != nil {
		// The last recovery point travels with the key to the attempt that
		// reclaims it, and to any attempt reclaiming after that.
		rec.Checkpoint = old.Checkpoint
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
		if c := rec.Checkpoint; c != nil && c.FencingToken != rec.FencingToken {
			r.Checkpoint = c
		}
	}
	return r
}

func (f *FSM) heartbeat(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	p := f.policies[k.Namespace]
	lease, res := resolve(cmd.Lease, cmd.LeaseIsDefault, p.DefaultLease, p.MaxLease, "max_lease_ms", 1e6)
	if res != nil {
		return *res
	}
	rec, ok := f.live(k, now)
	if !ok || rec.State != StateInProgress || rec.OwnerToken != cmd.OwnerToken {
		return Result{Outcome: OutcomeNotOwner}
	}
	renewed := *rec
	renewed.LeaseExpiresAt = now + lease
	f.put(k, rec, &renewed)
	return Result{Outcome: OutcomeOK, FencingToken: rec.FencingToken, LeaseExpiresAt: renewed.LeaseExpiresAt}
}

func (f *FSM) complete(now int64, cmd *Command) Result {
	k := RecordKey{cmd.Namespace, cmd.Key}
	p := f.policies[k.Namespace]
	retention, res := resolve(cmd.Retention, cmd.RetentionIsDefault, p.DefaultRetention, p.MaxRetention, "max_retention_s", 1e9)
	if res != nil {
		return *res
	}
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
	done.ExpiresAt = now + retention
	done.Response = cloneResponse(cmd.Response)
	done.Checkpoint = nil // a complete drops the recovery point
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
// MaxSweep) and reservations whose lease ended more than AbandonAfter ago
// (oldest lease first, at most MaxSweep more). Both come from the store's
// indexes in a total order, so a bounded sweep drops the same records on
// every replica, and its cost is bounded by MaxSweep, not by the state.
func (f *FSM) sweep(now int64, cmd *Command) Result {
	swept := f.sweepExpired(now, cmd.MaxSweep)
	if cmd.AbandonAfter > 0 {
		n, bytes := f.store.DropLeasesEnded(now-cmd.AbandonAfter, cmd.MaxSweep)
		f.meta.InProgress -= int64(n)
		f.meta.Bytes -= bytes
		swept += n
	}
	return Result{Outcome: OutcomeOK, Swept: swept}
}

// put replaces old (nil if absent) at k with rec (nil deletes) and keeps the
// counts in step.
func (f *FSM) put(k RecordKey, old, rec *Record) {
	if old != nil {
		f.meta.count(k, old, -1)
	}
	if rec != nil {
		f.meta.count(k, rec, +1)
	}
	f.store.Put(k, old, rec)
}

// count adds (sign +1) or removes (-1) r's share of the counts.
func (m *Meta) count(k RecordKey, r *Record, sign int64) {
	m.Bytes += sign * RecordBytes(k, r)
	switch r.State {
	case StateInProgress:
		m.InProgress += sign
	case StateCompleted:
		m.Completed += sign
	case StateExpired:
		m.Tombstones += sign
	default: // a policy or the partition table
		m.Policies += sign
	}
}

// RecordBytes approximates what the record r at k costs (Stats().Bytes is
// their sum): its strings, response and checkpoint plus a fixed overhead (a
// tombstone, which holds no owner, response or checkpoint, a smaller one).
func RecordBytes(k RecordKey, r *Record) int64 {
	overhead := recordOverhead
	if r.State == StateExpired {
		overhead = tombstoneOverhead
	}
	n := overhead + len(k.Namespace) + len(k.Key) + len(r.Fingerprint) + len(r.OwnerToken)
	if r.Response != nil {
		n += responseSize(r.Response)
	}
	if c := r.Checkpoint; c != nil {
		n += 32 + len(c.Name) + len(c.Data)
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
	rec, ok := f.store.Lookup(RecordKey{namespace, key})
	rec, ok = liveRecord(rec, ok, max(now, f.meta.Clock), f.policies[namespace])
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
	// Tombstones counts EXPIRED records stored by sweeps.
	Tombstones int
	// Bytes approximates the memory the records take.
	Bytes int64
	// Clock is the highest command time applied (Unix nanoseconds).
	Clock int64
	// LastIndex is the log index of the last entry applied.
	LastIndex uint64
}

// Stats returns the current figures.
func (f *FSM) Stats() Stats {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return Stats{
		Records:    int(f.meta.InProgress + f.meta.Completed + f.meta.Tombstones),
		InProgress: int(f.meta.InProgress),
		Completed:  int(f.meta.Completed),
		Tombstones: int(f.meta.Tombstones),
		Bytes:      f.meta.Bytes,
		Clock:      f.meta.Clock,
		LastIndex:  entryOf(f.meta.LastIndex),
	}
}
