package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/idem-dev/idem/internal/durable"
	"go.etcd.io/bbolt"
)

// sharedLogFile is the shared log's file name under Config.DataDir.
const sharedLogFile = "log.db"

// maxCommitWrites caps how many group writes one shared commit carries (and
// sizes the queue): large enough that a node's every group fits, small
// enough that one commit stays a few megabytes at most.
const maxCommitWrites = 1024

// errGroupBucketMissing means a group's buckets vanished under it; only a
// bug or a foreign tool could do that.
var errGroupBucketMissing = errors.New("raftstore: group's buckets missing from the shared log")

// errNotFound is the StableStore's "no such key". hashicorp/raft recognises
// it by its text ("not found"), as raft-boltdb's ErrKeyNotFound.
var errNotFound = errors.New("not found")

// errSharedLogClosed is returned by writes after the shared log closed (the
// host is stopping; raft has stopped or is about to).
var errSharedLogClosed = fmt.Errorf("shared log closed: %w", ErrShutdown)

// sharedLog is one bbolt file holding the Raft log and stable store of every
// group of a host that uses it (a bucket pair per group), written by a
// group-commit writer: every write (StoreLogs, DeleteRange, Set) of every
// group is queued to one goroutine, which commits everything queued while
// the previous commit was being fsync'd in one bbolt transaction. Groups
// that write at the same moment (leaders storing new entries, followers
// storing replicated ones) thus share one fsync pair instead of paying one
// each. A write returns only after its transaction committed (and was
// fsync'd, unless NoFsync): the durability of a group's own bolt file.
type sharedLog struct {
	db   *bbolt.DB
	path string

	mu     sync.RWMutex // held shared while queueing, exclusively to close
	closed bool
	queue  chan *logWrite
	done   chan struct{} // closed when the writer goroutine exits

	metrics *hostMetrics
	// onFail is told, once, that the log failed (the host logs it).
	onFail func(error)
	// commitTx commits a write transaction: (*bbolt.Tx).Commit, replaced
	// by tests to inject a failed write or fsync.
	commitTx func(*bbolt.Tx) error
	// failed is the sticky error of a failed commit: once set, every write
	// gets it and nothing more is committed (fail-stop, see fail).
	failed atomic.Pointer[error]

	commits     atomic.Uint64 // bbolt transactions committed
	writes      atomic.Uint64 // group writes they carried
	commitNanos atomic.Int64  // time spent committing
}

// logWrite is one group's write, applied inside a shared transaction.
type logWrite struct {
	// apply makes the changes. It may run twice (a shared transaction that
	// fails is retried write by write), so it must only depend on tx.
	apply func(tx *bbolt.Tx) error
	err   chan error // buffered: the writer never blocks on an answer
}

// openSharedLog opens (creating if needed) the shared log file and starts
// its writer. A file that bbolt cannot read gives one error naming it
// (ErrCorruptLog), never a panic. onFail (may be nil) is told once when a
// commit fails.
func openSharedLog(path string, noSync bool, m *hostMetrics, onFail func(error)) (*sharedLog, error) {
	existed, err := fileExists(path)
	if err != nil {
		return nil, err
	}
	db, err := openBolt(path)
	if err != nil {
		return nil, err
	}
	if !existed && !noSync {
		// The new file's directory entry must be durable before anything
		// written into the file is acknowledged.
		if err := syncDir(filepath.Dir(path)); err != nil {
			db.Close()
			return nil, err
		}
	}
	db.NoSync = noSync
	s := &sharedLog{
		db:       db,
		path:     path,
		queue:    make(chan *logWrite, maxCommitWrites),
		done:     make(chan struct{}),
		metrics:  m,
		onFail:   onFail,
		commitTx: (*bbolt.Tx).Commit,
	}
	go s.run()
	return s, nil
}

// openBolt opens the shared log's bbolt file, turning bbolt's panics on a
// damaged file into ErrCorruptLog.
func openBolt(path string) (db *bbolt.DB, err error) {
	defer func() {
		if p := recover(); p != nil {
			db, err = nil, fmt.Errorf("%w: %s: %v", ErrCorruptLog, path, p)
		}
	}()
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{
		// Fail fast instead of hanging if another process holds the file.
		Timeout: time.Second,
		// The freelist is rebuilt by a scan on open instead of being
		// written by every commit: fewer pages per fsync. etcd does the
		// same; it is crash-safe (the meta page never points at it).
		NoFreelistSync: true,
		FreelistType:   bbolt.FreelistMapType,
	})
	switch {
	case errors.Is(err, bbolt.ErrTimeout):
		return nil, fmt.Errorf("raftstore: %s is in use by another process: %w", path, err)
	case errors.Is(err, bbolt.ErrInvalid), errors.Is(err, bbolt.ErrVersionMismatch), errors.Is(err, bbolt.ErrChecksum),
		errors.Is(err, bbolt.ErrInvalidMapping):
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptLog, path, err)
	case err != nil:
		return nil, fmt.Errorf("raftstore: opening %s: %w", path, err)
	}
	return db, nil
}

// syncDir fsyncs a directory, making the entries of files created in it
// durable.
func syncDir(dir string) error {
	if err := durable.SyncDir(dir); err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	return nil
}

// mkdirDurable creates dir and its missing parents, fsyncing each new
// entry unless noSync.
func mkdirDurable(dir string, noSync bool) error {
	if noSync {
		return os.MkdirAll(dir, 0o750)
	}
	return durable.MkdirAll(dir, 0o750)
}

// fileExists reports whether path exists.
func fileExists(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (s *sharedLog) run() {
	defer close(s.done)
	batch := make([]*logWrite, 0, maxCommitWrites)
	for first := range s.queue {
		batch = append(batch[:0], first)
		// Let the groups answered by the previous commit run first: those
		// with more to write queue it now and join this commit, instead of
		// arriving a moment too late and waiting out a whole commit (on a
		// busy node this raises the writes per commit from ~2 to ~3 with
		// four groups; on an idle one it returns at once).
		runtime.Gosched()
	drain:
		for len(batch) < maxCommitWrites {
			select {
			case w, ok := <-s.queue:
				if !ok {
					break drain
				}
				batch = append(batch, w)
			default:
				break drain
			}
		}
		s.commit(batch)
		clear(batch) // drop references to answered writes
	}
}

// commit applies batch in one transaction and answers every write.
//
// A write whose own changes fail (before anything reaches the disk) rolls
// the transaction back; the writes are then committed one by one, so one
// group's failure is not another's. A failed commit is different: bbolt
// wrote pages and fsync'd, or tried to, and an fsync error may mean the
// kernel dropped dirty pages it will never write again, so retrying could
// acknowledge what is not on disk. The log fails stop instead (fail): every
// write of the batch and every later one gets ErrStorageFailed.
func (s *sharedLog) commit(batch []*logWrite) {
	answer := func(err error) {
		for _, w := range batch {
			w.err <- err
		}
	}
	if err := s.failure(); err != nil {
		answer(err)
		return
	}
	start := time.Now()
	tx, err := s.db.Begin(true)
	if err != nil {
		answer(s.fail(fmt.Errorf("beginning a write transaction: %w", err)))
		return
	}
	for _, w := range batch {
		if err := w.apply(tx); err != nil {
			tx.Rollback()
			if len(batch) == 1 {
				answer(err)
				return
			}
			for _, w := range batch {
				s.commit([]*logWrite{w})
			}
			return
		}
	}
	if err := s.commitTx(tx); err != nil {
		answer(s.fail(err))
		return
	}
	took := time.Since(start)
	s.commits.Add(1)
	s.writes.Add(uint64(len(batch)))
	s.commitNanos.Add(int64(took))
	if s.metrics != nil {
		s.metrics.sharedCommits.Inc()
		s.metrics.sharedCommitWrites.Observe(float64(len(batch)))
		s.metrics.sharedCommitDuration.Observe(took.Seconds())
	}
	answer(nil)
}

// failCommitsAfter makes every commit after the first n fail as a failed
// fsync would (Config.TestingFailCommitsAfter: fault injection for tests).
func (s *sharedLog) failCommitsAfter(n uint64) {
	var done atomic.Uint64
	s.commitTx = func(tx *bbolt.Tx) error {
		if done.Add(1) > n {
			tx.Rollback()
			return fmt.Errorf("injected fault: commit %d failed (--testing-fail-log-commits-after %d)", done.Load(), n)
		}
		return tx.Commit()
	}
}

// fail makes the log fail stop with cause (the first cause wins) and
// returns the sticky error every write gets from now on.
func (s *sharedLog) fail(cause error) error {
	err := fmt.Errorf("%w: write or fsync of %s failed, no more writes are taken from this node's Raft log (fix the disk and restart): %v",
		ErrStorageFailed, s.path, cause)
	if !s.failed.CompareAndSwap(nil, &err) {
		return *s.failed.Load()
	}
	if s.metrics != nil {
		s.metrics.storageFailures.Inc()
	}
	if s.onFail != nil {
		s.onFail(err)
	}
	return err
}

// failure returns the sticky error of a failed commit, or nil.
func (s *sharedLog) failure() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// write queues apply and waits until it is committed.
func (s *sharedLog) write(apply func(tx *bbolt.Tx) error) error {
	w := &logWrite{apply: apply, err: make(chan error, 1)}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return errSharedLogClosed
	}
	s.queue <- w // the writer drains the queue until close, so this returns
	s.mu.RUnlock()
	return <-w.err
}

// close commits what is queued, stops the writer and closes the file.
func (s *sharedLog) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.queue)
	s.mu.Unlock()
	<-s.done
	return s.db.Close()
}

// SharedLogStats are the shared log's figures (zero without one).
type SharedLogStats struct {
	Commits    uint64        // fsync'd bbolt transactions
	Writes     uint64        // group writes (StoreLogs, DeleteRange, Set) they carried
	CommitTime time.Duration // total time spent in those commits
}

func (s *sharedLog) stats() SharedLogStats {
	return SharedLogStats{
		Commits:    s.commits.Load(),
		Writes:     s.writes.Load(),
		CommitTime: time.Duration(s.commitNanos.Load()),
	}
}

// Bucket names of a group: shard ids never contain '/'.
func logBucket(id string) []byte    { return []byte("log/" + id) }
func stableBucket(id string) []byte { return []byte("stable/" + id) }

// hasGroup reports whether the shared log holds group id's buckets.
func (s *sharedLog) hasGroup(id string) (bool, error) {
	found := false
	err := s.db.View(func(tx *bbolt.Tx) error {
		found = tx.Bucket(logBucket(id)) != nil
		return nil
	})
	return found, err
}

// group returns group id's log and stable store, creating its buckets.
func (s *sharedLog) group(id string) (*sharedGroupStore, error) {
	logs, stable := logBucket(id), stableBucket(id)
	err := s.write(func(tx *bbolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(logs); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(stable)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &sharedGroupStore{log: s, id: id, logs: logs, stable: stable}, nil
}

// sharedGroupStore is one group's raft.LogStore and raft.StableStore in the
// shared log. Log entries are keyed by their big-endian index (so a cursor
// walks them in order) and encoded with encodeLog.
type sharedGroupStore struct {
	log          *sharedLog
	id           string
	logs, stable []byte
}

var (
	_ raft.LogStore    = (*sharedGroupStore)(nil)
	_ raft.StableStore = (*sharedGroupStore)(nil)
)

// logsFillPercent packs the log's B+tree pages: entries are appended in
// index order, so half-empty pages (bbolt's default split at 50%) would
// never fill up again.
const logsFillPercent = 0.9

func indexKey(idx uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), idx) }

func (g *sharedGroupStore) FirstIndex() (uint64, error) { return g.edgeIndex(true) }
func (g *sharedGroupStore) LastIndex() (uint64, error)  { return g.edgeIndex(false) }

func (g *sharedGroupStore) edgeIndex(first bool) (uint64, error) {
	var idx uint64
	err := g.log.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(g.logs)
		if b == nil {
			return errGroupBucketMissing
		}
		var k []byte
		if first {
			k, _ = b.Cursor().First()
		} else {
			k, _ = b.Cursor().Last()
		}
		if k != nil {
			idx = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return idx, err
}

func (g *sharedGroupStore) GetLog(idx uint64, l *raft.Log) error {
	return g.log.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(g.logs)
		if b == nil {
			return errGroupBucketMissing
		}
		v := b.Get(indexKey(idx))
		if v == nil {
			return raft.ErrLogNotFound
		}
		return decodeLog(idx, v, l)
	})
}

func (g *sharedGroupStore) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

func (g *sharedGroupStore) StoreLogs(logs []*raft.Log) error {
	// Encode here, on the caller's goroutine, so the writer only copies.
	keys := make([][]byte, len(logs))
	vals := make([][]byte, len(logs))
	for i, l := range logs {
		keys[i] = indexKey(l.Index)
		vals[i] = encodeLog(l)
	}
	return g.log.write(func(tx *bbolt.Tx) error {
		b := tx.Bucket(g.logs)
		if b == nil {
			return errGroupBucketMissing
		}
		b.FillPercent = logsFillPercent
		for i := range keys {
			if err := b.Put(keys[i], vals[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

func (g *sharedGroupStore) DeleteRange(lo, hi uint64) error {
	return g.log.write(func(tx *bbolt.Tx) error {
		b := tx.Bucket(g.logs)
		if b == nil {
			return errGroupBucketMissing
		}
		// Collect first, then delete: deleting under a moving cursor is easy
		// to get subtly wrong.
		var keys [][]byte
		c := b.Cursor()
		for k, _ := c.Seek(indexKey(lo)); k != nil && binary.BigEndian.Uint64(k) <= hi; k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

func (g *sharedGroupStore) Set(k, v []byte) error {
	k, v = bytes.Clone(k), bytes.Clone(v)
	return g.log.write(func(tx *bbolt.Tx) error {
		b := tx.Bucket(g.stable)
		if b == nil {
			return errGroupBucketMissing
		}
		return b.Put(k, v)
	})
}

func (g *sharedGroupStore) Get(k []byte) ([]byte, error) {
	var out []byte
	err := g.log.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(g.stable)
		if b == nil {
			return errGroupBucketMissing
		}
		v := b.Get(k)
		if v == nil {
			return errNotFound
		}
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

func (g *sharedGroupStore) SetUint64(k []byte, v uint64) error { return setUint64(g.Set, k, v) }

func (g *sharedGroupStore) GetUint64(k []byte) (uint64, error) { return getUint64(g.Get, k) }

// setUint64 and getUint64 keep a stable-store number as 8 big-endian bytes
// under k, in the host's shared logs (bolt and pebble alike).
func setUint64(set func(k, v []byte) error, k []byte, v uint64) error {
	return set(k, binary.BigEndian.AppendUint64(nil, v))
}

func getUint64(get func(k []byte) ([]byte, error), k []byte) (uint64, error) {
	v, err := get(k)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("raftstore: stable value %q is %d bytes, want 8", k, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// Close does nothing: the file belongs to the host, which closes it after
// every group stopped.
func (g *sharedGroupStore) Close() error { return nil }

// Log entry encoding in the shared log (the index is the key):
//
//	version=2 | type (1 byte) | term (uvarint) | appended at (varint Unix
//	nanoseconds, 0 for none) | data (uvarint length, bytes) | extensions
//	(uvarint length, bytes) | CRC-32C (4 bytes, big endian) of the index
//	(8 bytes, big endian) and everything before it
//
// Version 1 is the same without the checksum; entries written by earlier
// releases keep decoding. The checksum covers the index so that an entry
// stored under another key (a misdirected write) is caught too.
const (
	logEncodingVersion   = 2
	logEncodingVersionV1 = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func logChecksum(idx uint64, entry []byte) uint32 {
	return crc32.Update(crc32.Checksum(indexKey(idx), castagnoli), castagnoli, entry)
}

func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 2+3*binary.MaxVarintLen64+2*binary.MaxVarintLen32+len(l.Data)+len(l.Extensions)+4)
	b = append(b, logEncodingVersion, byte(l.Type))
	b = binary.AppendUvarint(b, l.Term)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.AppendVarint(b, at)
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	b = append(b, l.Extensions...)
	return binary.BigEndian.AppendUint32(b, logChecksum(l.Index, b))
}

// errBadLogEntry means a stored entry does not decode.
var errBadLogEntry = errors.New("raftstore: corrupt log entry in the shared log")

// decodeLog decodes v (bbolt memory, valid only during the transaction)
// into l, copying every byte it keeps.
func decodeLog(idx uint64, v []byte, l *raft.Log) error {
	if len(v) < 2 || (v[0] != logEncodingVersion && v[0] != logEncodingVersionV1) {
		return fmt.Errorf("%w: entry %d has an unknown header", errBadLogEntry, idx)
	}
	bad := func(what string) error { return fmt.Errorf("%w: entry %d: bad %s", errBadLogEntry, idx, what) }
	if v[0] == logEncodingVersion {
		if len(v) < 6 {
			return bad("length")
		}
		body, sum := v[:len(v)-4], binary.BigEndian.Uint32(v[len(v)-4:])
		if logChecksum(idx, body) != sum {
			return bad("checksum")
		}
		v = body
	}
	typ := raft.LogType(v[1])
	v = v[2:]
	term, n := binary.Uvarint(v)
	if n <= 0 {
		return bad("term")
	}
	v = v[n:]
	at, n := binary.Varint(v)
	if n <= 0 {
		return bad("timestamp")
	}
	v = v[n:]
	field := func(what string) ([]byte, error) {
		size, n := binary.Uvarint(v)
		if n <= 0 || size > uint64(len(v)-n) {
			return nil, bad(what)
		}
		p := v[n : n+int(size)]
		v = v[n+int(size):]
		if size == 0 {
			return nil, nil
		}
		return bytes.Clone(p), nil
	}
	data, err := field("data")
	if err != nil {
		return err
	}
	ext, err := field("extensions")
	if err != nil {
		return err
	}
	if len(v) != 0 {
		return bad("length")
	}
	*l = raft.Log{Index: idx, Term: term, Type: typ, Data: data, Extensions: ext}
	if at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	return nil
}
