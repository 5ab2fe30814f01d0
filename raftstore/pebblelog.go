package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
)

// pebbleLogDir is the pebble log's directory under Config.DataDir.
const pebbleLogDir = "raftlog"

// pebbleLogFormat is the value of pebbleFormatKey: the layout below. A
// directory holding another value was written by a release this one does
// not understand and is refused (ErrCorruptLog) rather than misread.
const pebbleLogFormat = "idem-raftlog/1"

// Key layout of the pebble log. Shard ids are 1-64 bytes of
// [A-Za-z0-9._-], so "<id>\x00" is a prefix no other group's keys share, and
// a key starting with \x00 belongs to no group.
//
//	\x00format                  pebbleLogFormat
//	<id>\x00m                   group marker (empty): the group lives here
//	<id>\x00l<index, 8 bytes BE> log entry, encodeLog
//	<id>\x00s<key>              stable-store value
var pebbleFormatKey = []byte("\x00format")

const (
	pebbleMarkerTag = 'm'
	pebbleLogTag    = 'l'
	pebbleStableTag = 's'
)

func pebbleGroupPrefix(id string) []byte { return append([]byte(id), 0) }

func pebbleKey(prefix []byte, tag byte, rest []byte) []byte {
	k := make([]byte, 0, len(prefix)+1+len(rest))
	k = append(append(k, prefix...), tag)
	return append(k, rest...)
}

// errPebbleLogClosed is returned after the pebble log closed (the host is
// stopping; raft has stopped or is about to).
var errPebbleLogClosed = fmt.Errorf("pebble log closed: %w", ErrShutdown)

// pebbleLog is one pebble instance per host (DataDir/raftlog) holding the
// Raft log and stable store of every group that uses it, under a key prefix
// per group. Every write (StoreLogs, DeleteRange, Set) is one batch
// committed with pebble.Sync: it returns once the batch is in the WAL and
// the WAL fdatasync'd. pebble's commit pipeline already merges the batches
// of concurrent committers into one WAL write and one fdatasync, so groups
// writing at the same moment share a sync without a writer of our own
// (measured in DESIGN.md "The pebble log"). It is a separate instance from
// the state engine (statedb) so that the state's flushes and compactions do
// not sit in front of the log's syncs.
type pebbleLog struct {
	db   *pebble.DB
	path string
	wo   *pebble.WriteOptions
	fs   *countingFS
	plog *pebbleLogger

	mu     sync.RWMutex // held shared by every operation, exclusively to close
	closed bool

	metrics *hostMetrics
	onFail  func(error)
	// commitBatch commits a batch: (*pebble.Batch).Commit with wo,
	// replaced by failCommitsAfter to inject a failed write or fsync.
	commitBatch func(b *pebble.Batch) error
	// failed is the sticky error of a failure: once set, every operation
	// gets it and nothing more is written (fail-stop, see fail).
	failed atomic.Pointer[error]

	commits     atomic.Uint64 // synced batches committed
	commitNanos atomic.Int64
}

// pebbleFatal is the panic value of pebbleLogger.Fatalf: pebble calls
// Fatalf when a commit failed (a WAL write or fdatasync error) and must not
// continue, so the logger fails the log stop and panics; a commit recovers
// it into an error (see commit), anything else crashes the process, which
// is fail-stop too.
type pebbleFatal struct{ err error }

// pebbleLogger routes pebble's log: errors to the host's logger, fatal
// errors to fail-stop. Informational chatter is dropped.
type pebbleLogger struct {
	logger *slog.Logger
	log    atomic.Pointer[pebbleLog]
}

func (l *pebbleLogger) Infof(string, ...any) {}
func (l *pebbleLogger) Errorf(format string, args ...any) {
	l.logger.Error("pebble log: " + strings.TrimSpace(fmt.Sprintf(format, args...)))
}
func (l *pebbleLogger) Fatalf(format string, args ...any) {
	err := fmt.Errorf("pebble: "+format, args...)
	if p := l.log.Load(); p != nil {
		err = p.fail(err)
	}
	panic(pebbleFatal{err})
}

// pebbleLogOptions are the log's pebble options: a small block cache (the
// group's LogCache in front serves nearly every read), 8 MiB memtables
// (pebble preallocates 110% of the memtable size for every WAL file, so
// larger ones cost disk a small data dir feels: 32 MiB took a third of the
// full-disk test's 96 MiB), no bloom filters (reads are of keys that exist,
// or seeks).
func pebbleLogOptions(fs vfs.FS, logger *pebbleLogger, onBackgroundError func(error)) *pebble.Options {
	o := &pebble.Options{
		FS:                          fs,
		Cache:                       pebble.NewCache(16 << 20),
		MemTableSize:                8 << 20,
		MemTableStopWritesThreshold: 4,
		MaxOpenFiles:                500,
		Logger:                      logger,
		EventListener: &pebble.EventListener{
			BackgroundError: onBackgroundError,
		},
	}
	o.EnsureDefaults()
	return o
}

// openPebbleLog opens (creating if needed) the pebble log in dir. A damaged
// directory (pebble reports corruption, or a foreign format key) is one
// error naming it that wraps ErrCorruptLog. onFail (may be nil) is told
// once when the log fails stop.
func openPebbleLog(dir string, noSync bool, m *hostMetrics, logger *slog.Logger, onFail func(error)) (_ *pebbleLog, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// The directory's own entry must be durable before anything written
	// into it is acknowledged; pebble syncs the directory's contents.
	if err := mkdirDurable(dir, noSync); err != nil {
		return nil, fmt.Errorf("raftstore: creating %s: %w", dir, err)
	}
	pl := &pebbleLogger{logger: logger}
	cfs := &countingFS{FS: vfs.Default, metrics: m}
	p := &pebbleLog{
		path:    dir,
		fs:      cfs,
		plog:    pl,
		wo:      pebble.Sync,
		metrics: m,
		onFail:  onFail,
	}
	if noSync {
		p.wo = pebble.NoSync
	}
	p.commitBatch = func(b *pebble.Batch) error { return b.Commit(p.wo) }
	opts := pebbleLogOptions(cfs, pl, func(err error) {
		if pebble.IsCorruptionError(err) {
			p.fail(fmt.Errorf("%w: %v", ErrCorruptLog, err))
		}
	})
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(pebbleFatal)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("raftstore: opening the pebble log %s: %w", dir, f.err)
		}
	}()
	db, err := pebble.Open(dir, opts)
	switch {
	case err != nil && pebble.IsCorruptionError(err):
		return nil, fmt.Errorf("%w: %s: %v", ErrCorruptLog, dir, err)
	case err != nil && strings.Contains(err.Error(), "lock"):
		return nil, fmt.Errorf("raftstore: %s is in use by another process: %w", dir, err)
	case err != nil:
		return nil, fmt.Errorf("raftstore: opening the pebble log %s: %w", dir, err)
	}
	p.db = db
	pl.log.Store(p)
	if err := p.checkFormat(); err != nil {
		db.Close()
		return nil, err
	}
	return p, nil
}

// checkFormat writes the format key into a new log and refuses a log with
// another one.
func (p *pebbleLog) checkFormat() error {
	v, closer, err := p.db.Get(pebbleFormatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		b := p.db.NewBatch()
		if err := b.Set(pebbleFormatKey, []byte(pebbleLogFormat), nil); err != nil {
			return err
		}
		return p.write(b)
	case err != nil:
		return p.readErr(err)
	}
	defer closer.Close()
	if string(v) != pebbleLogFormat {
		return fmt.Errorf("%w: %s: format %q, want %q", ErrCorruptLog, p.path, v, pebbleLogFormat)
	}
	return nil
}

// write commits b with the log's write options (synced unless NoFsync) and
// closes it. A failed commit fails the log stop: pebble has written the
// WAL, or tried to, and an fsync error may mean dropped pages, so nothing
// after it can be acknowledged.
func (p *pebbleLog) write(b *pebble.Batch) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		b.Close()
		return errPebbleLogClosed
	}
	if err := p.failure(); err != nil {
		b.Close()
		return err
	}
	start := time.Now()
	if err := p.commit(b); err != nil {
		// The batch is left to the collector: after a failed commit
		// pebble may still reference it.
		return p.fail(err)
	}
	b.Close()
	took := time.Since(start)
	p.commits.Add(1)
	p.commitNanos.Add(int64(took))
	if p.metrics != nil {
		p.metrics.pebbleCommits.Inc()
		p.metrics.pebbleCommitDuration.Observe(took.Seconds())
	}
	return nil
}

// commit runs commitBatch, turning pebble's fatal commit error (Fatalf,
// which has already failed the log) into an error.
func (p *pebbleLog) commit(b *pebble.Batch) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(pebbleFatal)
			if !ok {
				panic(r)
			}
			err = f.err
		}
	}()
	return p.commitBatch(b)
}

// failCommitsAfter makes every commit after the first n fail as a failed
// fsync would (Config.TestingFailCommitsAfter: fault injection for tests).
func (p *pebbleLog) failCommitsAfter(n uint64) {
	var done atomic.Uint64
	p.commitBatch = func(b *pebble.Batch) error {
		if done.Add(1) > n {
			return fmt.Errorf("injected fault: commit %d failed (--testing-fail-log-commits-after %d)", done.Load(), n)
		}
		return b.Commit(p.wo)
	}
}

// fail makes the log fail stop with cause (the first cause wins) and
// returns the sticky error every operation gets from now on.
func (p *pebbleLog) fail(cause error) error {
	var err error
	if errors.Is(cause, ErrStorageFailed) {
		err = cause
	} else {
		err = fmt.Errorf("%w: the Raft log %s failed, this node takes no more writes from it (fix the disk and restart): %w",
			ErrStorageFailed, p.path, cause)
	}
	if !p.failed.CompareAndSwap(nil, &err) {
		return *p.failed.Load()
	}
	if p.metrics != nil {
		p.metrics.storageFailures.Inc()
	}
	if p.onFail != nil {
		p.onFail(err)
	}
	return err
}

// failure returns the sticky error of a failure, or nil.
func (p *pebbleLog) failure() error {
	if e := p.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// readErr maps a read error: corruption pebble detected (a block or WAL
// checksum) fails the log stop, like an entry that does not decode.
func (p *pebbleLog) readErr(err error) error {
	if pebble.IsCorruptionError(err) {
		return p.fail(fmt.Errorf("%w: %v", ErrCorruptLog, err))
	}
	return fmt.Errorf("raftstore: reading the pebble log %s: %w", p.path, err)
}

// read runs fn unless the log closed or failed.
func (p *pebbleLog) read(fn func() error) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errPebbleLogClosed
	}
	if err := p.failure(); err != nil {
		return err
	}
	return fn()
}

// close closes the instance after the operations under way.
func (p *pebbleLog) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if err := p.db.Close(); err != nil {
		return fmt.Errorf("raftstore: closing the pebble log %s: %w", p.path, err)
	}
	return nil
}

// PebbleLogStats are the pebble log's figures (zero without one).
type PebbleLogStats struct {
	Commits    uint64        // batches committed (each a StoreLogs, DeleteRange or Set of a group)
	CommitTime time.Duration // total time spent in those commits
	WALSyncs   uint64        // fsyncs/fdatasyncs of WAL files: commits share them
	Syncs      uint64        // every fsync/fdatasync of the instance (WAL, sstables, MANIFEST, directories)
}

func (p *pebbleLog) stats() PebbleLogStats {
	return PebbleLogStats{
		Commits:    p.commits.Load(),
		CommitTime: time.Duration(p.commitNanos.Load()),
		WALSyncs:   p.fs.walSyncs.Load(),
		Syncs:      p.fs.syncs.Load(),
	}
}

// hasGroup reports whether the log holds group id (its marker).
func (p *pebbleLog) hasGroup(id string) (bool, error) {
	found := false
	err := p.read(func() error {
		_, closer, err := p.db.Get(pebbleKey(pebbleGroupPrefix(id), pebbleMarkerTag, nil))
		switch {
		case errors.Is(err, pebble.ErrNotFound):
			return nil
		case err != nil:
			return p.readErr(err)
		}
		found = true
		return closer.Close()
	})
	return found, err
}

// group returns group id's log and stable store, writing its marker if
// new, with its first and last index read from disk.
func (p *pebbleLog) group(id string) (*pebbleGroupStore, error) {
	prefix := pebbleGroupPrefix(id)
	g := &pebbleGroupStore{
		log:    p,
		id:     id,
		prefix: prefix,
		logLo:  pebbleKey(prefix, pebbleLogTag, nil),
		logHi:  pebbleKey(prefix, pebbleLogTag+1, nil),
	}
	ok, err := p.hasGroup(id)
	if err != nil {
		return nil, err
	}
	if !ok {
		b := p.db.NewBatch()
		if err := b.Set(pebbleKey(prefix, pebbleMarkerTag, nil), nil, nil); err != nil {
			return nil, err
		}
		if err := p.write(b); err != nil {
			return nil, err
		}
	}
	if err := g.loadIndexes(); err != nil {
		return nil, err
	}
	return g, nil
}

// pebbleGroupStore is one group's raft.LogStore and raft.StableStore in the
// pebble log. FirstIndex and LastIndex are served from memory: read from
// disk by seeking when the group opens and after a DeleteRange, and
// advanced by StoreLogs once its batch is durable, under mu, so they always
// describe what is on disk.
type pebbleGroupStore struct {
	log          *pebbleLog
	id           string
	prefix       []byte
	logLo, logHi []byte // bounds of the group's log keys [lo, hi)

	mu          sync.Mutex // serialises the group's log writes with the index update
	first, last atomic.Uint64
}

var (
	_ raft.LogStore    = (*pebbleGroupStore)(nil)
	_ raft.StableStore = (*pebbleGroupStore)(nil)
)

func (g *pebbleGroupStore) logKey(idx uint64) []byte {
	return binary.BigEndian.AppendUint64(pebbleKey(g.prefix, pebbleLogTag, nil), idx)
}

// loadIndexes reads the first and last index from disk (0, 0 for an empty
// log).
func (g *pebbleGroupStore) loadIndexes() error {
	return g.log.read(func() error {
		it, err := g.log.db.NewIter(&pebble.IterOptions{LowerBound: g.logLo, UpperBound: g.logHi})
		if err != nil {
			return g.log.readErr(err)
		}
		var first, last uint64
		if it.First() {
			first = binary.BigEndian.Uint64(it.Key()[len(g.logLo):])
			if it.Last() {
				last = binary.BigEndian.Uint64(it.Key()[len(g.logLo):])
			}
		}
		if err := it.Close(); err != nil {
			return g.log.readErr(err)
		}
		g.first.Store(first)
		g.last.Store(last)
		return nil
	})
}

func (g *pebbleGroupStore) FirstIndex() (uint64, error) { return g.first.Load(), nil }
func (g *pebbleGroupStore) LastIndex() (uint64, error)  { return g.last.Load(), nil }

func (g *pebbleGroupStore) GetLog(idx uint64, l *raft.Log) error {
	return g.log.read(func() error {
		v, closer, err := g.log.db.Get(g.logKey(idx))
		switch {
		case errors.Is(err, pebble.ErrNotFound):
			return raft.ErrLogNotFound
		case err != nil:
			return g.log.readErr(err)
		}
		defer closer.Close()
		if err := decodeLog(idx, v, l); err != nil {
			// A stored entry that does not decode (its CRC fails): the
			// log fails stop, as on a failed fsync.
			return g.log.fail(fmt.Errorf("%w: shard %s: %w", ErrCorruptLog, g.id, err))
		}
		return nil
	})
}

func (g *pebbleGroupStore) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

func (g *pebbleGroupStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	b := g.log.db.NewBatch()
	lo, hi := uint64(math.MaxUint64), uint64(0)
	for _, l := range logs {
		if err := b.Set(g.logKey(l.Index), encodeLog(l), nil); err != nil {
			b.Close()
			return err
		}
		lo, hi = min(lo, l.Index), max(hi, l.Index)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.log.write(b); err != nil {
		return err
	}
	if first := g.first.Load(); first == 0 || lo < first {
		g.first.Store(lo)
	}
	if hi > g.last.Load() {
		g.last.Store(hi)
	}
	return nil
}

// DeleteRange deletes [lo, hi] with one range deletion: the covered entries
// are dropped when pebble flushes or compacts, no point deletes needed.
func (g *pebbleGroupStore) DeleteRange(lo, hi uint64) error {
	if lo > hi {
		return nil
	}
	end := g.logHi
	if hi < math.MaxUint64 {
		end = g.logKey(hi + 1)
	}
	b := g.log.db.NewBatch()
	if err := b.DeleteRange(g.logKey(lo), end, nil); err != nil {
		b.Close()
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.log.write(b); err != nil {
		return err
	}
	return g.loadIndexes()
}

func (g *pebbleGroupStore) Set(k, v []byte) error {
	b := g.log.db.NewBatch()
	if err := b.Set(pebbleKey(g.prefix, pebbleStableTag, k), v, nil); err != nil {
		b.Close()
		return err
	}
	return g.log.write(b)
}

func (g *pebbleGroupStore) Get(k []byte) ([]byte, error) {
	var out []byte
	err := g.log.read(func() error {
		v, closer, err := g.log.db.Get(pebbleKey(g.prefix, pebbleStableTag, k))
		switch {
		case errors.Is(err, pebble.ErrNotFound):
			return errNotFound
		case err != nil:
			return g.log.readErr(err)
		}
		out = bytes.Clone(v)
		return closer.Close()
	})
	return out, err
}

func (g *pebbleGroupStore) SetUint64(k []byte, v uint64) error { return setUint64(g.Set, k, v) }

func (g *pebbleGroupStore) GetUint64(k []byte) (uint64, error) { return getUint64(g.Get, k) }

// Close does nothing: the instance belongs to the host, which closes it
// after every group stopped.
func (g *pebbleGroupStore) Close() error { return nil }

// countingFS counts the fsyncs pebble issues (WAL files apart), for the
// figures in PebbleLogStats and the benchmarks.
type countingFS struct {
	vfs.FS
	metrics         *hostMetrics
	walSyncs, syncs atomic.Uint64
}

func (fs *countingFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return f, err
	}
	return &countingFile{File: f, fs: fs, wal: strings.HasSuffix(name, ".log")}, nil
}

func (fs *countingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *countingFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

func (fs *countingFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

func (fs *countingFS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	return fs.wrap(name, f, err)
}

type countingFile struct {
	vfs.File
	fs  *countingFS
	wal bool
}

func (f *countingFile) count() {
	f.fs.syncs.Add(1)
	if f.wal {
		f.fs.walSyncs.Add(1)
		if f.fs.metrics != nil {
			f.fs.metrics.pebbleWALSyncs.Inc()
		}
	}
}

func (f *countingFile) Sync() error     { f.count(); return f.File.Sync() }
func (f *countingFile) SyncData() error { f.count(); return f.File.SyncData() }
func (f *countingFile) SyncTo(length int64) (bool, error) {
	full, err := f.File.SyncTo(length)
	if full {
		f.count()
	}
	return full, err
}

// pebbleLogPath is the pebble log's directory for a data dir.
func pebbleLogPath(dataDir string) string { return filepath.Join(dataDir, pebbleLogDir) }
