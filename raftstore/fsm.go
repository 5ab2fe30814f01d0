package raftstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// StateMachine is what a group replicates into (package fsm adapts to it
// elsewhere). raftstore never looks inside commands.
type StateMachine interface {
	// Apply applies one committed command; index is its Raft log index. The
	// returned value is handed back to the proposer by Group.Apply. Called
	// from one goroutine at a time.
	Apply(index uint64, data []byte) any

	// Snapshot captures a point-in-time view cheaply on the apply goroutine;
	// the view is written out later, concurrently with further Apply calls.
	Snapshot() (SnapshotWriter, error)

	// Restore replaces all state with the snapshot read from r.
	Restore(r io.Reader) error
}

// DurableStateMachine is a StateMachine that keeps its state on disk with
// the Raft index it covers. A group over one starts with raft's
// NoSnapshotRestoreOnStart: on restart it neither restores a snapshot nor
// re-applies entries the state already covers (raft hands them again; the
// adapter skips every entry at or below AppliedIndex). It restores a
// snapshot at start only if the state on disk is older than the newest
// snapshot (a state that never was on disk: an upgraded data dir, or an
// engine that lost unsynced writes the snapshot covers).
type DurableStateMachine interface {
	StateMachine
	// AppliedIndex is the Raft index the state on disk covers; 0 if none.
	// Read once, when the group opens.
	AppliedIndex() uint64
	// CommitApplied makes every Apply since the last call part of the
	// state together with index, atomically (in one engine batch): after a
	// crash either both or neither are there. Called once per ApplyBatch.
	// An error is a storage failure: the group applies nothing more (later
	// entries answer ErrUnknownOutcome wrapping ErrStorageFailed) and the
	// host reports it through Config.OnStorageFailure (the node exits with
	// one log line); without that callback it panics.
	CommitApplied(index uint64) error
	// RestoreApplied replaces the state with the snapshot read from r,
	// which covers Raft index applied, atomically with that index. On
	// error the old state is intact.
	RestoreApplied(r io.Reader, applied uint64) error
}

// LiveSnapshotter is a DurableStateMachine whose Raft snapshots refer to
// its own state on disk instead of copying it (see DESIGN.md "Reference
// snapshots"): taking a snapshot costs one sync, whatever the state's size,
// and the state is read out only when a follower needs it.
type LiveSnapshotter interface {
	DurableStateMachine
	// SyncState makes everything committed so far (CommitApplied) survive
	// a crash. Called on the apply goroutine before a reference snapshot is
	// written: the state on disk then covers the snapshot's index.
	SyncState() error
	// LiveSnapshot captures the committed state now, with the Raft index it
	// covers. Called from any goroutine (a leader's replication sending a
	// snapshot), concurrently with Apply. WriteTo must be repeatable and
	// write the same bytes each time (its size is measured first).
	LiveSnapshot() (SnapshotWriter, uint64, error)
}

// SnapshotWriter is a captured view of a StateMachine.
type SnapshotWriter interface {
	// WriteTo writes the view; it runs concurrently with Apply.
	WriteTo(w io.Writer) (int64, error)
	// Release frees the view; it is always called, even if WriteTo was not.
	Release()
}

// Snapshot stream layout: our header, then the StateMachine's bytes.
//
//	magic "IDRS" | version (1 byte) | applied index (8 bytes, big endian) [| CRC-32C of the 13 bytes before (4, big endian), version 4]
//
// The applied index is the last log entry the StateMachine had seen when the
// view was captured. raft's own snapshot index may be slightly higher (it
// also counts no-op and barrier entries the StateMachine never sees); after a
// restore the header lets fsmAdapter know exactly what the state covers.
//
// Version 4 is a full snapshot (header, then the state), the header with a
// checksum of itself; every full snapshot is written so. 4, not 3: no
// single flipped bit turns it into version 1 or 2, which the checksum
// would not cover. The state's bytes
// carry their own checksum (package fsm's CRC-32C trailer) and raft's file
// store a CRC-64 of a file on disk, but nothing else covers the applied
// index of a stream as it is restored (a follower checksums what it
// received): a flipped bit there would make a durable state machine skip or
// re-apply log entries silently.
//
// Version 1 is a full snapshot of an older release, without the checksum:
// still restored.
//
// Version 2 is a reference snapshot of a LiveSnapshotter: the header alone,
// the state being the state machine's own on disk, synced up to at least
// the header's applied index before the header was written. It never
// leaves the node (raft's CRC-64 covers it on disk): liveSnapshotStore.Open
// turns it into a version 4 stream of the live state (with the live state's
// applied index in its header).
var snapMagic = [4]byte{'I', 'D', 'R', 'S'}

const (
	snapVersion       = 1 // full, header unchecked (older releases)
	snapVersionRef    = 2 // reference
	snapVersionSummed = 4 // full, header checked
	snapHeaderLen     = 13
	snapSummedLen     = 17
)

// snapHeader is a version 1 or 2 header.
func snapHeader(version byte, applied uint64) []byte {
	h := make([]byte, snapHeaderLen)
	copy(h[:4], snapMagic[:])
	h[4] = version
	binary.BigEndian.PutUint64(h[5:], applied)
	return h
}

// fullSnapHeader is the header of a full snapshot: version 4, checksummed.
func fullSnapHeader(applied uint64) []byte {
	h := snapHeader(snapVersionSummed, applied)
	return binary.BigEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
}

// readSnapHeader reads a snapshot header of any version and returns the
// version and the applied index it carries; a damaged or unknown one is
// ErrCorruptSnapshot.
func readSnapHeader(r io.Reader) (version byte, applied uint64, err error) {
	h := make([]byte, snapSummedLen)
	if _, err := io.ReadFull(r, h[:snapHeaderLen]); err != nil {
		return 0, 0, fmt.Errorf("%w: reading its header: %v", ErrCorruptSnapshot, err)
	}
	if [4]byte(h[:4]) != snapMagic {
		return 0, 0, fmt.Errorf("%w: not an idem snapshot (header %x)", ErrCorruptSnapshot, h[:5])
	}
	switch h[4] {
	case snapVersion, snapVersionRef:
	case snapVersionSummed:
		if _, err := io.ReadFull(r, h[snapHeaderLen:]); err != nil {
			return 0, 0, fmt.Errorf("%w: reading its header: %v", ErrCorruptSnapshot, err)
		}
		if want, got := crc32.Checksum(h[:snapHeaderLen], castagnoli), binary.BigEndian.Uint32(h[snapHeaderLen:]); want != got {
			return 0, 0, fmt.Errorf("%w: header checksum %08x, computed %08x", ErrCorruptSnapshot, got, want)
		}
	default:
		return 0, 0, fmt.Errorf("%w: unknown header version %d (written by a newer release?)", ErrCorruptSnapshot, h[4])
	}
	return h[4], binary.BigEndian.Uint64(h[5:snapHeaderLen]), nil
}

// fsmAdapter turns a StateMachine into a raft.BatchingFSM and tracks how far
// it has applied, which ReadBarrier and Ready wait on.
type fsmAdapter struct {
	sm      StateMachine
	durable DurableStateMachine // sm, when it is one; nil otherwise
	metrics *groupMetrics
	// onDisk is the index a DurableStateMachine covered when the group
	// opened: entries up to it that raft hands again are skipped.
	onDisk uint64

	// applied is the index of the last LogCommand or LogConfiguration entry
	// handed to this adapter. raft.AppliedIndex() is not usable for reads: it
	// advances when entries are queued for the FSM goroutine, before they
	// are applied.
	applied atomic.Uint64

	mu     sync.Mutex
	waitCh chan struct{} // closed (and replaced) whenever applied advances

	batches  atomic.Uint64 // ApplyBatch calls that carried commands
	commands atomic.Uint64 // commands applied
	restores atomic.Uint64 // snapshots restored into the state machine

	// onFail, when set, is told once that a DurableStateMachine could not
	// commit an applied batch; the adapter then applies nothing more (the
	// host's storage failure, see Config.OnStorageFailure). Without it such
	// a failure panics.
	onFail func(error)
	failed atomic.Pointer[error]

	// times, when tracing is on, remembers when batches were applied
	// (trace.go); nil otherwise.
	times *applyTimes
}

var _ raft.BatchingFSM = (*fsmAdapter)(nil)

func newFSMAdapter(sm StateMachine, m *groupMetrics) *fsmAdapter {
	f := &fsmAdapter{sm: sm, metrics: m}
	if d, ok := sm.(DurableStateMachine); ok {
		f.durable = d
		f.onDisk = d.AppliedIndex()
		f.applied.Store(f.onDisk)
	}
	return f
}

// ApplyBatch applies every committed command of a batch in one call; raft
// hands over up to MaxAppendEntries entries at a time.
func (f *fsmAdapter) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	if p := f.failed.Load(); p != nil {
		// The state on disk stopped following the log: apply nothing on top
		// of it. The entries are committed in the Raft log, so nothing
		// acknowledged is lost; a restart re-applies them from there.
		for i := range out {
			out[i] = *p
		}
		return out
	}
	if f.times != nil && len(logs) > 0 {
		b := appliedBatch{first: logs[0].Index, last: logs[len(logs)-1].Index, start: time.Now(), entries: len(logs)}
		// Recorded before raft hands the results to the proposers.
		defer func() { b.end = time.Now(); f.times.record(b) }()
	}
	cmds := 0
	for i, l := range logs {
		if l.Index <= f.onDisk {
			continue // already in the durable state: applied before a restart
		}
		if l.Type == raft.LogCommand {
			out[i] = f.sm.Apply(l.Index, l.Data)
			cmds++
		}
		// LogConfiguration entries carry membership, not state machine data.
	}
	if cmds > 0 {
		f.batches.Add(1)
		f.commands.Add(uint64(cmds))
		f.metrics.batchSize.Observe(float64(cmds))
	}
	if len(logs) > 0 {
		last := logs[len(logs)-1].Index
		if f.durable != nil && last > f.onDisk {
			if err := f.durable.CommitApplied(last); err != nil {
				// The state machine could not make this batch part of its
				// state; going on would diverge from the log. Stop applying
				// and say so once (the node exits on it), or stop loudly
				// without a handler. This batch's entries are committed in
				// the Raft log: answering them loses nothing.
				ferr := fmt.Errorf("%w: the state machine could not commit applied index %d: %v", ErrStorageFailed, last, err)
				if f.onFail == nil {
					panic(ferr.Error())
				}
				if f.failed.CompareAndSwap(nil, &ferr) {
					f.onFail(ferr)
				}
			}
		}
		if last > f.applied.Load() {
			f.setApplied(last)
		}
	}
	return out
}

// Apply is the non-batched path raft uses only if batching is off; kept for
// the raft.FSM interface.
func (f *fsmAdapter) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

func (f *fsmAdapter) setApplied(idx uint64) {
	f.mu.Lock()
	f.applied.Store(idx)
	if f.waitCh != nil {
		close(f.waitCh)
		f.waitCh = nil
	}
	f.mu.Unlock()
}

// appliedChanged returns the applied index and a channel closed when it next
// changes.
func (f *fsmAdapter) appliedChanged() (uint64, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.waitCh == nil {
		f.waitCh = make(chan struct{})
	}
	return f.applied.Load(), f.waitCh
}

func (f *fsmAdapter) Snapshot() (raft.FSMSnapshot, error) {
	if live, ok := f.sm.(LiveSnapshotter); ok {
		if err := live.SyncState(); err != nil {
			return nil, err
		}
		return &fsmSnapshot{applied: f.applied.Load(), metrics: f.metrics}, nil
	}
	w, err := f.sm.Snapshot()
	if err != nil {
		return nil, err
	}
	return &fsmSnapshot{w: w, applied: f.applied.Load(), metrics: f.metrics}, nil
}

func (f *fsmAdapter) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	version, applied, err := readSnapHeader(rc)
	if err != nil {
		return err
	}
	if version == snapVersionRef {
		// A reference snapshot is opened through liveSnapshotStore, which
		// turns it into a full one: one here was sent by a peer or read
		// around the store, and has no state.
		return fmt.Errorf("%w: a reference snapshot (no state) where a full one was expected", ErrCorruptSnapshot)
	}
	if f.durable != nil {
		err = f.durable.RestoreApplied(rc, applied)
	} else {
		err = f.sm.Restore(rc)
	}
	if err != nil {
		return fmt.Errorf("raftstore: restoring state machine: %w", err)
	}
	// raft hands the entries after its snapshot's index from now on. A
	// live snapshot may cover more than that index (the leader's state when
	// it was sent): a durable state skips every entry it already holds.
	f.onDisk = 0
	if f.durable != nil {
		f.onDisk = applied
	}
	f.setApplied(applied)
	f.restores.Add(1)
	f.metrics.restores.Inc()
	return nil
}

// fsmSnapshot writes our header and then the StateMachine's view, or, with
// no view (a LiveSnapshotter's), a reference snapshot: the header alone.
type fsmSnapshot struct {
	w       SnapshotWriter
	applied uint64
	metrics *groupMetrics
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	start := time.Now()
	h := fullSnapHeader(s.applied)
	if s.w == nil {
		h = snapHeader(snapVersionRef, s.applied)
	}
	if _, err := sink.Write(h); err != nil {
		sink.Cancel()
		return fmt.Errorf("raftstore: writing snapshot header: %w", err)
	}
	if s.w != nil {
		if _, err := s.w.WriteTo(sink); err != nil {
			sink.Cancel()
			return fmt.Errorf("raftstore: writing snapshot: %w", err)
		}
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("raftstore: closing snapshot: %w", err)
	}
	s.metrics.snapshots.Inc()
	s.metrics.snapshotDuration.Observe(time.Since(start).Seconds())
	return nil
}

func (s *fsmSnapshot) Release() {
	if s.w != nil {
		s.w.Release()
	}
}
