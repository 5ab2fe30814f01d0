package fsm

import (
	"bufio"
	"container/heap"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

// snapshotMagic starts every snapshot stream; the last byte is the format version.
var snapshotMagic = []byte("IDEMFSM\x01")

// maxFrame bounds one encoded record on restore, so a corrupt length cannot
// make the restorer allocate without bound. Records are far smaller (the
// API limits responses to a few MiB).
const maxFrame = 256 << 20

// Snapshot is a point-in-time view of an FSM, taken cheaply under the lock
// (records are immutable, so it holds pointers) and written out later while
// Apply goes on.
type Snapshot struct {
	clock     int64
	lastIndex uint64
	entries   []keyedRecord
}

// Snapshot captures the current state. It costs one pointer copy per record;
// sorting and encoding happen in WriteTo.
func (f *FSM) Snapshot() *Snapshot {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := &Snapshot{clock: f.clock, lastIndex: f.lastIndex, entries: make([]keyedRecord, 0, f.store.Len())}
	f.store.Range(func(k RecordKey, r *Record) bool {
		s.entries = append(s.entries, keyedRecord{k, r})
		return true
	})
	return s
}

// Release drops the snapshot's references.
func (s *Snapshot) Release() { s.entries = nil }

// WriteTo streams the snapshot: magic, clock, last index, record count, the
// records in (namespace, key) order as length-prefixed frames, and a CRC-32C
// of everything before it. Equal states give equal bytes.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	sortedRecords(s.entries)
	cw := &countingWriter{w: bufio.NewWriterSize(w, 256<<10), crc: crc32.New(crc32.MakeTable(crc32.Castagnoli))}
	hdr := append([]byte(nil), snapshotMagic...)
	hdr = binary.AppendVarint(hdr, s.clock)
	hdr = binary.AppendUvarint(hdr, s.lastIndex)
	hdr = binary.AppendUvarint(hdr, uint64(len(s.entries)))
	cw.write(hdr)
	var frame []byte
	for _, e := range s.entries {
		frame = appendRecord(frame[:0], e.k, e.r)
		cw.write(binary.AppendUvarint(nil, uint64(len(frame))))
		cw.write(frame)
	}
	sum := cw.crc.Sum32()
	cw.crc = nil
	cw.write(binary.BigEndian.AppendUint32(nil, sum))
	if cw.err == nil {
		cw.err = cw.w.Flush()
	}
	return cw.n, cw.err
}

type countingWriter struct {
	w   *bufio.Writer
	crc hash.Hash32
	n   int64
	err error
}

func (c *countingWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	if c.crc != nil {
		c.crc.Write(p)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
}

func appendRecord(b []byte, k RecordKey, r *Record) []byte {
	b = appendString(b, k.Namespace)
	b = appendString(b, k.Key)
	b = append(b, byte(r.State))
	b = appendString(b, r.Fingerprint)
	b = appendString(b, r.OwnerToken)
	b = binary.AppendUvarint(b, r.FencingToken)
	b = binary.AppendUvarint(b, r.PreviousFencingToken)
	b = binary.AppendVarint(b, r.LeaseExpiresAt)
	b = binary.AppendVarint(b, r.CreatedAt)
	b = binary.AppendVarint(b, r.CompletedAt)
	b = binary.AppendVarint(b, r.ExpiresAt)
	return appendResponse(b, r.Response)
}

func decodeRecord(frame []byte) (RecordKey, *Record, error) {
	d := decoder{buf: frame}
	k := RecordKey{Namespace: d.string(), Key: d.string()}
	r := &Record{State: State(d.byte())}
	r.Fingerprint = d.string()
	r.OwnerToken = d.string()
	r.FencingToken = d.uvarint()
	r.PreviousFencingToken = d.uvarint()
	r.LeaseExpiresAt = d.varint()
	r.CreatedAt = d.varint()
	r.CompletedAt = d.varint()
	r.ExpiresAt = d.varint()
	r.Response = d.response()
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes in record", ErrCorrupt, len(d.buf))
	}
	if d.err == nil && r.State != StateInProgress && r.State != StateCompleted {
		d.err = fmt.Errorf("%w: record state %d", ErrCorrupt, r.State)
	}
	if d.err == nil && (k.Namespace == "" || k.Key == "") {
		d.err = fmt.Errorf("%w: record without namespace or key", ErrCorrupt)
	}
	return k, r, d.err
}

// Restore replaces the FSM's state with the snapshot read from r. On error
// the FSM is left unchanged.
func (f *FSM) Restore(r io.Reader) error {
	cr := &crcReader{r: bufio.NewReaderSize(r, 256<<10), crc: crc32.New(crc32.MakeTable(crc32.Castagnoli))}
	magic := make([]byte, len(snapshotMagic))
	if _, err := io.ReadFull(cr, magic); err != nil {
		return fmt.Errorf("%w: snapshot header: %v", ErrCorrupt, err)
	}
	if string(magic) != string(snapshotMagic) {
		return fmt.Errorf("%w: not an idem fsm snapshot (or an unknown version)", ErrCorrupt)
	}
	clock, err1 := binary.ReadVarint(cr)
	lastIndex, err2 := binary.ReadUvarint(cr)
	count, err3 := binary.ReadUvarint(cr)
	if err1 != nil || err2 != nil || err3 != nil {
		return fmt.Errorf("%w: snapshot header fields", ErrCorrupt)
	}

	fresh := NewWithStore(NewMemStore())
	fresh.clock, fresh.lastIndex = clock, lastIndex
	var frame []byte
	for i := uint64(0); i < count; i++ {
		n, err := binary.ReadUvarint(cr)
		if err != nil || n > maxFrame {
			return fmt.Errorf("%w: record %d frame length", ErrCorrupt, i)
		}
		if uint64(cap(frame)) < n {
			frame = make([]byte, n)
		}
		frame = frame[:n]
		if _, err := io.ReadFull(cr, frame); err != nil {
			return fmt.Errorf("%w: record %d: %v", ErrCorrupt, i, err)
		}
		k, rec, err := decodeRecord(frame)
		if err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		if _, dup := fresh.store.Get(k); dup {
			return fmt.Errorf("%w: record %d duplicates key %q", ErrCorrupt, i, k.Key)
		}
		fresh.store.Put(k, rec)
		fresh.index(k, rec)
	}
	want := cr.crc.Sum32()
	cr.crc = nil
	var trailer [4]byte
	if _, err := io.ReadFull(cr, trailer[:]); err != nil {
		return fmt.Errorf("%w: snapshot checksum: %v", ErrCorrupt, err)
	}
	if got := binary.BigEndian.Uint32(trailer[:]); got != want {
		return fmt.Errorf("%w: snapshot checksum %08x, computed %08x", ErrCorrupt, got, want)
	}
	heap.Init(&fresh.expiry)

	f.mu.Lock()
	defer f.mu.Unlock()
	f.store, f.clock, f.lastIndex = fresh.store, fresh.clock, fresh.lastIndex
	f.inProgress, f.expiry, f.bytes = fresh.inProgress, fresh.expiry, fresh.bytes
	return nil
}

// crcReader hashes what passes through it (until crc is set to nil) and is
// an io.ByteReader for binary.ReadUvarint.
type crcReader struct {
	r   *bufio.Reader
	crc hash.Hash32
}

func (c *crcReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.crc != nil {
		c.crc.Write(p[:n])
	}
	return n, err
}

func (c *crcReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil && c.crc != nil {
		c.crc.Write([]byte{b})
	}
	return b, err
}
