package fsm

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/idem-dev/idem/keyspace"
)

// Partition handoff: how a shard's state machine gives ring partitions to
// another shard and takes them from one, so that keys can change home shard
// while they are in use. See DESIGN.md, "Partitions and handoff".
//
// A group's partition table says, for each ring partition the group was
// ever involved in moving, whether it owns it. A group with no table (every
// group until its first handoff) owns every key routed to it, as before
// partitions could move. Commands on a key whose partition the group does
// not own are answered OutcomeMoved, at apply time: the log position where
// a partition left (OpFreeze applied) is the line after which the source
// admits no work for it, whatever its proposers believed.

// PartitionsNamespace holds the group's partition table: one record
// (StatePartitions, key PartitionsKey), stored, snapshotted and restored
// like any record. No valid namespace starts with '!'.
const PartitionsNamespace = "!partitions"

// PartitionsKey is the key of the partition table's record.
const PartitionsKey = "table"

// MaxHandoffPartitions bounds the partitions one handoff command names.
const MaxHandoffPartitions = 1 << 16

// MaxPartitionCount bounds the ring's partition count a command may carry
// (the ring's own bound, topology.MaxPartitionCount).
const MaxPartitionCount = 1 << 20

// PartitionOf is the ring partition of (namespace, key) among count
// partitions (keyspace.Partition, the function topology.Ring places keys
// with).
func PartitionOf(namespace, key string, count uint32) uint32 {
	return keyspace.Partition(namespace, key, count)
}

// Handoff is the payload of the partition commands (OpFreeze, OpImport,
// OpOpen, OpDrop, OpAdopt).
type Handoff struct {
	// Count is the ring's partition count (fixed for a cluster's life).
	Count uint32
	// Partitions are the partitions the command moves: sorted, distinct,
	// each below Count.
	Partitions []uint32
	// Epoch is the topology version that moves them.
	Epoch uint64
	// Peer is the other shard: the destination (freeze) or the source
	// (import, open).
	Peer string
	// Floor (import) is the highest fencing token the source had issued when
	// it froze the partitions (the freeze's Result.FencingToken).
	Floor uint64
	// Reset (import) starts the import of Partitions: records the group
	// still holds for them (from an earlier stay) are dropped first.
	Reset bool
	// Records (import) are records of Partitions, as the source held them
	// when it froze them.
	Records []KeyedRecord
	// Limit (drop) bounds the records one drop deletes; 0 means no bound.
	Limit int

	// Attempt fences the command (freeze, import, open, drop): the handoff
	// attempt that sends it, an id the meta group recorded before the
	// attempt's first step and that grows with every attempt (its log
	// index there). 0 is an unfenced command of a release before fenced
	// handoff, applied by the rules of that release. See DESIGN.md,
	// "Fenced attempts".
	Attempt uint64
	// Clock (fenced import) is the source's clock when it froze the
	// partitions (the freeze's Result.Clock): the destination's clock is
	// raised to it, so that time never goes back for a key that moves.
	Clock int64
	// Expect (fenced open) is the digest of every record the attempt
	// exported: the destination opens only if its imports of this attempt
	// brought exactly these.
	Expect Digest
}

// fenced reports whether h carries the fields of fenced handoff.
func (h *Handoff) fenced() bool { return h.Attempt != 0 || h.Clock != 0 || h.Expect != (Digest{}) }

// Digest summarises a set of records as an import carries them: how many,
// and the sum of the xxHash64 of each one's AppendRecord frame. The sum
// does not depend on the order the records travel in.
type Digest struct {
	Records uint64
	Sum     uint64
}

// Add counts one record frame (AppendRecord's encoding).
func (d *Digest) Add(frame []byte) {
	d.Records++
	d.Sum += xxhash.Sum64(frame)
}

// Merge adds o's records to d.
func (d *Digest) Merge(o Digest) {
	d.Records += o.Records
	d.Sum += o.Sum
}

// partKind is what a group knows of one partition.
type partKind uint8

const (
	partOwned    partKind = 1 // the group serves it
	partOut      partKind = 2 // frozen here at Epoch, now at Peer's
	partIncoming partKind = 3 // being imported from Peer; not served yet
)

type partState struct {
	kind  partKind
	epoch uint64
	peer  string
	// attempt is the fenced handoff attempt that froze (out), imports
	// (incoming) or opened (owned) the partition; 0: none, or unfenced.
	attempt uint64
	// digest (incoming, fenced) is what the attempt's imports brought.
	digest Digest
}

// partTable is a group's partition table. The zero value (count 0) is a
// group that never took part in a handoff: it serves every key routed to
// it. A group adopts a table (OpAdopt) before its first handoff, listing
// the partitions it serves; from then on it serves exactly the partitions
// its table says it owns.
type partTable struct {
	count uint32
	parts []partState // by partition; kind 0: the group never had it
	// tokenBase is added to every fencing-token slot: raised by an import
	// so that the next token exceeds every token the source issued.
	tokenBase uint64
}

// owns reports whether the group serves keys of partition p, and if not,
// the state it knows (the destination of a partition that left).
func (t *partTable) owns(p uint32) (bool, partState) {
	s := t.parts[p]
	return s.kind == partOwned, s
}

// ownsKey is owns for the partition of k; a group without a table owns
// every key.
func (t *partTable) ownsKey(k RecordKey) (bool, partState) {
	if t.count == 0 {
		return true, partState{}
	}
	return t.owns(PartitionOf(k.Namespace, k.Key, t.count))
}

// movedResult is the answer to a command on a key the group does not own.
func movedResult(s partState) Result {
	return Result{Outcome: OutcomeMoved, MovedTo: s.peer, Epoch: s.epoch}
}

// firstRefused checks a handoff step against every partition it names:
// the answer for the first one whose state does not allow it (allowed),
// naming where that partition is and since which epoch, or nil.
func firstRefused(t *partTable, parts []uint32, allowed func(owned bool, s partState) bool) *Result {
	for _, p := range parts {
		if owned, s := t.owns(p); !allowed(owned, s) {
			return &Result{Outcome: OutcomeFailedPrecondition, MovedTo: s.peer, Epoch: s.epoch}
		}
	}
	return nil
}

func (t *partTable) clone() partTable {
	c := *t
	c.parts = slices.Clone(t.parts)
	return c
}

// Partition-table record encoding (the Body of the record's Response):
//
//	version 1 | uvarint count | uvarint tokenBase |
//	uvarint n | n x (uvarint partition delta | kind byte | uvarint epoch | string peer)
//
// listing the partitions the group knows, in partition order (each as its
// distance from the previous one), so replicas store identical bytes.
// Version 2, written once any partition has a fenced attempt, adds to each
// entry: uvarint attempt, and for an incoming one its digest (uvarint
// records | 8-byte sum). A table without attempts is still version 1, byte
// for byte.
const (
	partTableVersion       = 1
	partTableVersionFenced = 2
)

func (t *partTable) encode() []byte {
	n, fenced := 0, false
	for _, s := range t.parts {
		if s.kind != 0 {
			n++
			fenced = fenced || s.attempt != 0 || s.digest != (Digest{})
		}
	}
	version := byte(partTableVersion)
	if fenced {
		version = partTableVersionFenced
	}
	b := make([]byte, 0, 32+n*4)
	b = append(b, version)
	b = binary.AppendUvarint(b, uint64(t.count))
	b = binary.AppendUvarint(b, t.tokenBase)
	b = binary.AppendUvarint(b, uint64(n))
	prev := uint64(0)
	for p, s := range t.parts {
		if s.kind == 0 {
			continue
		}
		b = binary.AppendUvarint(b, uint64(p)-prev)
		prev = uint64(p)
		b = append(b, byte(s.kind))
		b = binary.AppendUvarint(b, s.epoch)
		b = appendString(b, s.peer)
		if fenced {
			b = binary.AppendUvarint(b, s.attempt)
			if s.kind == partIncoming {
				b = binary.AppendUvarint(b, s.digest.Records)
				b = binary.BigEndian.AppendUint64(b, s.digest.Sum)
			}
		}
	}
	return b
}

func decodePartTable(data []byte) (partTable, error) {
	d := decoder{buf: data}
	version := d.byte()
	if version != partTableVersion && version != partTableVersionFenced && d.err == nil {
		return partTable{}, fmt.Errorf("%w: partition table version", ErrCorrupt)
	}
	t := partTable{count: uint32(min(d.uvarint(), MaxPartitionCount+1))}
	t.tokenBase = d.uvarint()
	n := d.uvarint()
	if d.err == nil && (t.count == 0 || t.count > MaxPartitionCount || n > uint64(t.count)) {
		d.fail("partition table size")
		return partTable{}, d.err
	}
	t.parts = make([]partState, t.count)
	p := uint64(0)
	for i := uint64(0); i < n && d.err == nil; i++ {
		delta := d.uvarint()
		if i > 0 && delta == 0 {
			d.fail("partition table order")
		}
		p += delta
		s := partState{kind: partKind(d.byte()), epoch: d.uvarint(), peer: d.string()}
		if version == partTableVersionFenced {
			s.attempt = d.uvarint()
			if s.kind == partIncoming {
				s.digest = Digest{Records: d.uvarint(), Sum: d.uint64()}
			}
		}
		if p >= uint64(t.count) || s.kind < partOwned || s.kind > partIncoming {
			d.fail("partition table entry")
			break
		}
		t.parts[p] = s
	}
	if d.err == nil && len(d.buf) != 0 {
		d.fail("partition table trailing bytes")
	}
	return t, d.err
}

// loadPartTable reads the partition table of s (the zero table: none).
func loadPartTable(s Store) partTable {
	r, ok := s.Get(RecordKey{PartitionsNamespace, PartitionsKey})
	if !ok || r.State != StatePartitions || r.Response == nil {
		return partTable{}
	}
	t, err := decodePartTable(r.Response.Body)
	if err != nil {
		panic("fsm: reading the partition table: " + err.Error())
	}
	return t
}

// savePartTable stores t as the partition table record.
func (f *FSM) savePartTable(t partTable) {
	k := RecordKey{PartitionsNamespace, PartitionsKey}
	old, ok := f.store.Get(k)
	if !ok {
		old = nil
	}
	f.put(k, old, &Record{State: StatePartitions, ExpiresAt: math.MaxInt64, Response: &Response{Body: t.encode()}})
	f.parts = t
}

// validHandoff checks what the mover must guarantee of a partition command.
func validHandoff(cmd *Command) bool {
	h := cmd.Handoff
	if h == nil || cmd.Namespace != "" || cmd.Key != "" || h.Count == 0 || h.Count > MaxPartitionCount {
		return false
	}
	if len(h.Partitions) > MaxHandoffPartitions && (cmd.Op != OpAdopt || len(h.Partitions) > int(h.Count)) {
		return false
	}
	for i, p := range h.Partitions {
		if p >= h.Count || (i > 0 && p <= h.Partitions[i-1]) {
			return false
		}
	}
	if cmd.Op != OpImport && (len(h.Records) > 0 || h.Reset || h.Floor != 0 || h.Clock != 0) {
		return false
	}
	if (cmd.Op != OpOpen && h.Expect != (Digest{})) || (cmd.Op == OpAdopt && h.Attempt != 0) || (h.fenced() && h.Attempt == 0) {
		return false
	}
	if h.Limit < 0 || (cmd.Op != OpDrop && h.Limit != 0) {
		return false
	}
	if cmd.Op == OpAdopt {
		return h.Peer == ""
	}
	if len(h.Partitions) == 0 || h.Epoch == 0 || (cmd.Op == OpFreeze && h.Peer == "") {
		return false
	}
	for _, kr := range h.Records {
		if kr.R == nil || kr.K.Namespace == "" || kr.K.Key == "" {
			return false
		}
		if kr.K.Namespace == PolicyNamespace {
			if !h.Reset || kr.R.State != StatePolicy || kr.R.Policy == nil || !validPolicy(*kr.R.Policy) {
				return false
			}
			continue
		}
		if kr.K.Namespace[0] == '!' || !slices.Contains(h.Partitions, PartitionOf(kr.K.Namespace, kr.K.Key, h.Count)) {
			return false
		}
	}
	return true
}

// handoffTable returns a copy of the group's table for a handoff command
// with partition count n: OutcomeInvalid when the table counts partitions
// differently (a proposer bug: the ring's count never changes), and
// OutcomeFailedPrecondition when the group has not adopted a table yet.
func (f *FSM) handoffTable(n uint32) (partTable, *Result) {
	switch f.parts.count {
	case n:
		return f.parts.clone(), nil
	case 0:
		return partTable{}, &Result{Outcome: OutcomeFailedPrecondition}
	}
	return partTable{}, &Result{Outcome: OutcomeInvalid}
}

// adopt gives a group that has no partition table one: it owns exactly
// the partitions listed (those the ring placed on it, or none for a group
// a topology change created) at epoch Epoch. The mover sends it to every
// group a layout change involves before any partition moves. A group that
// has a table already keeps it (OK: adopting again is a no-op); a list of
// none is refused for a group that holds records.
func (f *FSM) adopt(cmd *Command) Result {
	h := cmd.Handoff
	if f.parts.count != 0 {
		if f.parts.count != h.Count {
			return Result{Outcome: OutcomeInvalid}
		}
		return Result{Outcome: OutcomeOK}
	}
	if len(h.Partitions) == 0 && f.meta.InProgress+f.meta.Completed+f.meta.Tombstones != 0 {
		return Result{Outcome: OutcomeFailedPrecondition}
	}
	t := partTable{count: h.Count, parts: make([]partState, h.Count)}
	for _, p := range h.Partitions {
		t.parts[p] = partState{kind: partOwned, epoch: h.Epoch}
	}
	f.savePartTable(t)
	return Result{Outcome: OutcomeOK}
}

// freeze stops the group admitting work for the partitions: from this
// entry on, commands on their keys are answered OutcomeMoved (naming Peer,
// the destination). The result's FencingToken is the highest token the
// group has issued, the floor the destination's tokens must exceed, and
// its Clock the group's clock, the floor of the destination's.
//
// Unfenced (Attempt 0): freezing a partition frozen at this or a later
// epoch is a no-op; freezing one the group does not own is refused.
// Fenced: a partition is frozen only from an epoch below the freeze's (a
// delayed freeze of an earlier change never strands a partition that came
// back since), and a freeze sent again is a no-op only for a partition
// frozen at this very epoch towards the same peer.
func (f *FSM) freeze(cmd *Command, token uint64) Result {
	h := cmd.Handoff
	t, refused := f.handoffTable(h.Count)
	if refused != nil {
		return *refused
	}
	allowed := func(owned bool, s partState) bool {
		return owned || (s.kind == partOut && s.epoch >= h.Epoch)
	}
	if h.Attempt != 0 {
		allowed = func(owned bool, s partState) bool {
			return (owned && s.epoch < h.Epoch) || (s.kind == partOut && s.epoch == h.Epoch && s.peer == h.Peer)
		}
	}
	if r := firstRefused(&t, h.Partitions, allowed); r != nil {
		return *r
	}
	for _, p := range h.Partitions {
		if owned, _ := t.owns(p); owned {
			t.parts[p] = partState{kind: partOut, epoch: h.Epoch, peer: h.Peer, attempt: h.Attempt}
		}
	}
	f.savePartTable(t)
	return Result{Outcome: OutcomeOK, FencingToken: token, Clock: f.meta.Clock}
}

// importRecords stores records of partitions the group is taking over and
// raises its token base above the source's floor (and, fenced, its clock
// to the source's). A Reset import starts the partitions (incoming;
// records the group still holds for them are dropped); later imports add
// records to incoming partitions only. An import into a partition the
// group owns is refused: it would overwrite live state. Fenced imports
// belong to one attempt: a Reset starts the attempt's transfer (refused
// while an attempt as recent or more recent has the partition), and every
// other import must be of the attempt that holds the partition, so that a
// deposed driver's late chunks never mix with a newer attempt's.
func (f *FSM) importRecords(cmd *Command) Result {
	h := cmd.Handoff
	t, refused := f.handoffTable(h.Count)
	if refused != nil {
		return *refused
	}
	if r := firstRefused(&t, h.Partitions, func(owned bool, s partState) bool { return mayImport(owned, s, h) }); r != nil {
		return *r
	}
	if h.Reset {
		f.dropPartitions(h.Count, h.Partitions, 0)
		for _, p := range h.Partitions {
			t.parts[p] = partState{kind: partIncoming, epoch: h.Epoch, peer: h.Peer, attempt: h.Attempt}
		}
	}
	base := t.tokenBase
	f.raiseTokens(&t, h.Floor)
	if h.Clock > f.meta.Clock {
		f.meta.Clock = h.Clock
	}
	changed := h.Reset || t.tokenBase != base
	for _, kr := range h.Records {
		old, ok := f.store.Get(kr.K)
		if kr.K.Namespace == PolicyNamespace {
			// The source's namespace policies travel with the first import,
			// so a group a change created enforces them; a policy the group
			// already has is newer or the same (set-policy reaches every
			// group) and is kept.
			if !ok {
				p := *kr.R.Policy
				f.put(kr.K, nil, &Record{State: StatePolicy, ExpiresAt: math.MaxInt64, Policy: &p})
				f.policies[kr.K.Key] = p
			}
			continue
		}
		if h.Attempt != 0 {
			p := PartitionOf(kr.K.Namespace, kr.K.Key, h.Count)
			t.parts[p].digest.Add(AppendRecord(nil, kr.K, kr.R))
			changed = true
		}
		if !ok {
			old = nil
		}
		rec := *kr.R
		f.put(kr.K, old, &rec)
	}
	if changed {
		f.savePartTable(t)
	}
	return Result{Outcome: OutcomeOK}
}

// mayImport reports whether an import h may write a partition the group
// owns (owned) or knows as s. Nothing overwrites an owned partition.
//
// Unfenced: a partition being imported at h's epoch takes more records (or
// starts over, on a Reset sent again); a Reset starts a partition the
// group does not serve (one it never had, one that left it at an earlier
// epoch, an import of an earlier epoch that never opened).
//
// Fenced: a Reset starts the partition for h's attempt where no attempt as
// recent has it (a later attempt of the same epoch takes it over, wiping
// what the earlier one imported); any other import adds to the partition
// only while h's attempt holds it.
func mayImport(owned bool, s partState, h *Handoff) bool {
	if h.Attempt != 0 {
		switch {
		case owned:
			return false
		case !h.Reset:
			return s.kind == partIncoming && s.epoch == h.Epoch && s.attempt == h.Attempt
		case s.kind == partIncoming && s.epoch == h.Epoch:
			return s.attempt < h.Attempt
		case s.kind == partOut || s.kind == partIncoming:
			return s.epoch < h.Epoch
		}
		return true // never had it
	}
	switch {
	case owned:
		return false // the refusal names the epoch it was opened at: an import that already opened
	case s.kind == partIncoming && s.epoch == h.Epoch:
		return true
	case !h.Reset:
		return false
	case s.kind == partOut || s.kind == partIncoming:
		return s.epoch < h.Epoch
	}
	return true // never had it
}

// raiseTokens raises t's token base so that every fencing token issued
// after this entry exceeds floor. A floor in packed mode switches the
// group's slots to packed mode first (the last slot of this very entry in
// packed form), so that tokens stay far from overflowing.
func (f *FSM) raiseTokens(t *partTable, floor uint64) {
	if floor&packedSlotMark != 0 && f.meta.LastIndex&packedSlotMark == 0 {
		f.meta.LastIndex = packedSlotMark | f.meta.LastIndex<<tokenPositionBits | (1<<tokenPositionBits - 1)
	}
	if last := f.meta.LastIndex + t.tokenBase; last < floor {
		t.tokenBase += floor - last
	}
}

// open makes incoming partitions the group's own: from this entry on it
// serves their keys. Unfenced, opening a partition already owned is a
// no-op. Fenced, the partitions must be incoming for h's attempt and their
// imports must have brought exactly h.Expect (the records the attempt
// exported); opening again what this attempt opened is a no-op, and
// anything else is refused.
func (f *FSM) open(cmd *Command) Result {
	h := cmd.Handoff
	t, refused := f.handoffTable(h.Count)
	if refused != nil {
		return *refused
	}
	allowed := func(owned bool, s partState) bool {
		return owned || (s.kind == partIncoming && s.epoch == h.Epoch)
	}
	if h.Attempt != 0 {
		allowed = func(owned bool, s partState) bool {
			return s.epoch == h.Epoch && s.attempt == h.Attempt && (owned || s.kind == partIncoming)
		}
	}
	if r := firstRefused(&t, h.Partitions, allowed); r != nil {
		return *r
	}
	if h.Attempt != 0 {
		var held Digest
		opened := 0
		for _, p := range h.Partitions {
			if t.parts[p].kind == partOwned {
				opened++
			}
			held.Merge(t.parts[p].digest)
		}
		switch {
		case opened == len(h.Partitions):
			return Result{Outcome: OutcomeOK} // this attempt opened them already
		case opened > 0 || held != h.Expect:
			// Some opened and some not cannot happen (an open names the
			// whole batch); a digest that differs is an import lost or
			// doubled: the attempt must start over.
			return Result{Outcome: OutcomeFailedPrecondition, Epoch: h.Epoch}
		}
	}
	for _, p := range h.Partitions {
		if owned, _ := t.owns(p); !owned {
			t.parts[p] = partState{kind: partOwned, epoch: h.Epoch, attempt: h.Attempt}
		}
	}
	f.savePartTable(t)
	return Result{Outcome: OutcomeOK}
}

// drop deletes up to Limit records of partitions that left the group
// (frozen here); Result.Swept is how many it deleted, fewer than Limit once
// none are left. The partitions stay frozen: late commands still learn
// where they went. The driver drops only partitions the meta group
// recorded as moved (opened at the destination), so a drop needs no
// attempt: whichever attempt opened them, the source's copy is garbage.
func (f *FSM) drop(cmd *Command) Result {
	h := cmd.Handoff
	if _, refused := f.handoffTable(h.Count); refused != nil {
		return *refused
	}
	if r := firstRefused(&f.parts, h.Partitions, func(_ bool, s partState) bool {
		return s.kind == partOut && s.epoch <= h.Epoch
	}); r != nil {
		return *r
	}
	return Result{Outcome: OutcomeOK, Swept: f.dropPartitions(h.Count, h.Partitions, h.Limit)}
}

// dropPartitions deletes up to limit (0: all) records of the partitions, in
// the store's ScanPartitions order, and returns how many it deleted. It
// reads the keys as the writer sees them (Store.PartitionKeys: the batch
// being applied included), so the result depends on the log alone, never
// on where a replica's apply batches were cut: a Reset import that follows
// another import of the same partitions in one batch drops what that
// import wrote, as it does on a replica that committed in between.
func (f *FSM) dropPartitions(count uint32, partitions []uint32, limit int) int {
	keys := f.store.PartitionKeys(count, partitions, limit)
	for _, k := range keys {
		cur, ok := f.store.Get(k)
		if !ok {
			panic(fmt.Sprintf("fsm: the writer's partition keys list %s/%s, which it does not hold", k.Namespace, k.Key))
		}
		f.put(k, cur, nil)
	}
	return len(keys)
}

// Owns reports whether the group serves (namespace, key) now, and if not,
// the shard it went to ("" while it is being imported here) and the epoch.
// Reads check it before they answer from the group's state.
func (f *FSM) Owns(namespace, key string) (owned bool, movedTo string, epoch uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	ok, s := f.parts.ownsKey(RecordKey{namespace, key})
	return ok, s.peer, s.epoch
}

// Read answers a read of (namespace, key) from one view of the state:
// whether the group serves the key now (if not, where it went and at which
// epoch, as Owns), and if it does, the record as of now (as Get). Checking
// ownership and reading the record under one lock keeps a freeze..drop
// applied in between from answering "not found" for a key that moved.
func (f *FSM) Read(namespace, key string, now int64) (rec Record, found, owned bool, movedTo string, epoch uint64) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	owned, s := f.parts.ownsKey(RecordKey{namespace, key})
	if !owned {
		return Record{}, false, false, s.peer, s.epoch
	}
	r, ok := f.store.Lookup(RecordKey{namespace, key})
	r, ok = liveRecord(r, ok, max(now, f.meta.Clock), f.policies[namespace])
	if !ok {
		return Record{}, false, true, "", 0
	}
	return *r, true, true, "", 0
}

// PartitionCount is the ring's partition count in the group's partition
// table; 0 while the group has none.
func (f *FSM) PartitionCount() uint32 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.parts.count
}

// PartitionInfo is what a group knows of one partition, for status pages
// and the mover.
type PartitionInfo struct {
	Partition uint32
	// State is "owned", "moved" or "incoming".
	State string
	Epoch uint64
	Peer  string
	// Attempt is the fenced handoff attempt that froze (moved), imports
	// (incoming) or opened (owned) it; 0 for none or unfenced.
	Attempt uint64
	// Digest (incoming) is what the attempt's imports brought so far.
	Digest Digest
}

// Partitions returns the group's partition table: its partition count (0:
// the group has none and serves every key routed to it) and the
// partitions it lists, in order.
func (f *FSM) Partitions() (count uint32, list []PartitionInfo) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	names := [...]string{partOwned: "owned", partOut: "moved", partIncoming: "incoming"}
	for p, s := range f.parts.parts {
		if s.kind != 0 {
			list = append(list, PartitionInfo{Partition: uint32(p), State: names[s.kind], Epoch: s.epoch, Peer: s.peer, Attempt: s.attempt, Digest: s.digest})
		}
	}
	return f.parts.count, list
}

// ExportPartitions calls fn with every committed record of the partitions
// (count partitions in the ring), partition by partition, each in (namespace, key) order, until fn
// returns false. The caller exports partitions the group froze: their
// records no longer change.
func (f *FSM) ExportPartitions(count uint32, partitions []uint32, fn func(KeyedRecord) bool) error {
	return f.store.ScanPartitions(count, partitions, func(k RecordKey, r *Record) bool {
		return fn(KeyedRecord{K: k, R: r})
	})
}

// PolicyRecords returns the group's namespace policies as the records an
// import carries.
func (f *FSM) PolicyRecords() []KeyedRecord {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]KeyedRecord, 0, len(f.policies))
	for ns, p := range f.policies {
		out = append(out, KeyedRecord{K: RecordKey{PolicyNamespace, ns}, R: &Record{State: StatePolicy, ExpiresAt: math.MaxInt64, Policy: &p}})
	}
	slices.SortFunc(out, func(a, b KeyedRecord) int { return strings.Compare(a.K.Key, b.K.Key) })
	return out
}

// PartitionStates returns what the group's table says of each partition
// it lists: "owned", "moved" or "incoming", with the epoch.
func (f *FSM) PartitionStates() map[uint32]PartitionInfo {
	_, list := f.Partitions()
	out := make(map[uint32]PartitionInfo, len(list))
	for _, pi := range list {
		out[pi.Partition] = pi
	}
	return out
}

// LastToken is the highest fencing token the group has issued (its last
// slot plus its token base).
func (f *FSM) LastToken() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.meta.LastIndex + f.parts.tokenBase
}
