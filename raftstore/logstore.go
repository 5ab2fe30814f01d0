package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/idem-dev/idem/internal/durable"
)

// boltLogFile is a group's raft-boltdb file under DataDir/shards/<id>/
// (LogStoreBolt).
const boltLogFile = "raft.db"

// sharedBoltLogFile is where the shared bolt log of development builds (one
// bbolt file for every group of a host) lived under Config.DataDir. No
// release reads it; a data dir holding one is refused (ErrUnsupportedLog).
const sharedBoltLogFile = "log.db"

// groupStore is a group's raft log and stable store.
type groupStore interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// dataDirLogStore says which log store a host keeps in cfg.DataDir, once,
// before any group opens: the store found on disk, or cfg's for a data dir
// that holds none yet. Every group of a host lives in that one store. A
// data dir holding another store than cfg names is refused
// (ErrLogStoreMismatch) rather than followed or ignored: a group that looked
// for its log in the store the setting names would find none and bootstrap
// again over its acknowledged writes. A data dir holding both stores
// (ErrStoreConflict) or a shared bolt log (ErrUnsupportedLog) is refused too.
func dataDirLogStore(cfg Config) (string, error) {
	shared := filepath.Join(cfg.DataDir, sharedBoltLogFile)
	if ok, err := fileExists(shared); err != nil {
		return "", fmt.Errorf("raftstore: checking for a log store: %w", err)
	} else if ok {
		return "", fmt.Errorf("%w: %s is a shared bolt Raft log of a development build; start this node on an empty data dir "+
			"(idemctl replace-node empties it and adds the node back to its shards)", ErrUnsupportedLog, shared)
	}
	var found []string
	pebbleDir := pebbleLogPath(cfg.DataDir)
	if ok, err := fileExists(pebbleDir); err != nil {
		return "", fmt.Errorf("raftstore: checking for a log store: %w", err)
	} else if ok {
		found = append(found, LogStorePebble)
	}
	bolts, err := filepath.Glob(filepath.Join(cfg.DataDir, "shards", "*", boltLogFile))
	if err != nil {
		return "", fmt.Errorf("raftstore: checking for a log store: %w", err)
	}
	if len(bolts) > 0 {
		found = append(found, LogStoreBolt)
	}
	switch {
	case len(found) > 1:
		return "", fmt.Errorf("%w: %s holds a pebble log (%s) and bolt logs (%s); move one of them away",
			ErrStoreConflict, cfg.DataDir, pebbleDir, bolts[0])
	case len(found) == 0:
		return cfg.logStore(), nil
	case found[0] != cfg.logStore():
		return "", fmt.Errorf("%w: %s holds %s Raft logs, LogStore is %s; start with the store the data dir was created with (%s)",
			ErrLogStoreMismatch, cfg.DataDir, found[0], cfg.logStore(), found[0])
	}
	return found[0], nil
}

// openGroupStore opens group id's log and stable store in the host's log
// store (h.logStore).
func (h *Host) openGroupStore(id, dir string) (groupStore, error) {
	if h.logStore == LogStorePebble {
		pl, err := h.openPebbleLog()
		if err != nil {
			return nil, shardErr(id, "opening the pebble log: %w", err)
		}
		g, err := pl.group(id)
		if err != nil {
			return nil, shardErr(id, "opening log store in the pebble log: %w", err)
		}
		return g, nil
	}
	bolt, err := raftboltdb.New(raftboltdb.Options{
		Path:   filepath.Join(dir, boltLogFile),
		NoSync: h.cfg.NoFsync,
		// Fail fast instead of hanging if another process holds the file.
		BoltOptions: &bbolt.Options{Timeout: time.Second},
	})
	if err != nil {
		return nil, shardErr(id, "opening log store: %w", err)
	}
	return bolt, nil
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

// errNotFound is the StableStore's "no such key". hashicorp/raft recognises
// it by its text ("not found"), as raft-boltdb's ErrKeyNotFound.
var errNotFound = errors.New("not found")

// setUint64 and getUint64 keep a stable-store number as 8 big-endian bytes
// under k in the pebble log.
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

func indexKey(idx uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), idx) }

// Log entry encoding in the pebble log (the index is the key):
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
var errBadLogEntry = errors.New("raftstore: corrupt log entry in the Raft log")

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
