package fsm

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"
)

// snapshotMagic starts every snapshot stream; the last byte is the format version.
var snapshotMagic = []byte("IDEMFSM\x01")

// MaxFrame bounds one encoded record on restore, so a corrupt length cannot
// make the restorer allocate without bound. It must exceed the largest
// record the API accepts (a response body at the ceiling of
// --max-response-bytes, 256 MiB, plus its headers, key, fingerprint and
// owner token), or a snapshot holding that record could not be restored.
const MaxFrame = 256<<20 + 8<<20

// Snapshot is a point-in-time view of an FSM, taken cheaply under the lock
// and written out later while Apply goes on.
type Snapshot struct {
	view StoreView
}

// Snapshot captures the current state (the store's View).
func (f *FSM) Snapshot() *Snapshot {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &Snapshot{view: f.store.View()}
}

// View is the store view the snapshot streams.
func (s *Snapshot) View() StoreView { return s.view }

// Release drops the snapshot's view.
func (s *Snapshot) Release() { s.view.Release() }

// WriteTo streams the snapshot: magic, clock, last index, record count, the
// records in (namespace, key) order as length-prefixed frames, and a CRC-32C
// of everything before it. Equal states give equal bytes.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	meta := s.view.Meta()
	cw := &countingWriter{w: bufio.NewWriterSize(w, 256<<10), crc: crc32.New(crc32.MakeTable(crc32.Castagnoli))}
	hdr := append([]byte(nil), snapshotMagic...)
	hdr = binary.AppendVarint(hdr, meta.Clock)
	hdr = binary.AppendUvarint(hdr, meta.LastIndex)
	hdr = binary.AppendUvarint(hdr, uint64(s.view.Len()))
	cw.write(hdr)
	written := 0
	err := s.view.Frames(func(frame []byte) error {
		cw.write(binary.AppendUvarint(nil, uint64(len(frame))))
		cw.write(frame)
		written++
		return cw.err
	})
	if err == nil && written != s.view.Len() {
		err = fmt.Errorf("fsm: snapshot view yielded %d records, counted %d", written, s.view.Len())
	}
	if err != nil {
		return cw.n, err
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

// AppendRecord appends the encoding of the record r at k (the snapshot frame
// format; a disk store keeps records in it too).
func AppendRecord(b []byte, k RecordKey, r *Record) []byte {
	// Grow once: four length prefixes, a byte, six varints, the response.
	n := 4*binary.MaxVarintLen32 + 1 + 6*binary.MaxVarintLen64 + len(k.Namespace) + len(k.Key) + len(r.Fingerprint) + len(r.OwnerToken) + 1
	if r.Response != nil {
		n += responseSize(r.Response) + 16 // responseSize is the accounting's figure, a little short of the encoding
	}
	b = slices.Grow(b, n)
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
	b = appendResponse(b, r.Response)
	if r.ExpiredAt == 0 && r.Checkpoint == nil && r.Policy == nil {
		return b // the format before v1.2, byte for byte
	}
	// The v1.2 tail: flags, then the fields they announce.
	var flags byte
	if r.ExpiredAt != 0 {
		flags |= recExpiredAt
	}
	if r.Checkpoint != nil {
		flags |= recCheckpoint
	}
	if r.Policy != nil {
		flags |= recPolicy
		if r.Policy.TombstoneSet {
			flags |= recTombstoneSet
		}
	}
	b = append(b, flags)
	if r.ExpiredAt != 0 {
		b = binary.AppendVarint(b, r.ExpiredAt)
	}
	if c := r.Checkpoint; c != nil {
		b = appendString(b, c.Name)
		b = appendBytes(b, c.Data)
		b = binary.AppendUvarint(b, c.FencingToken)
		b = binary.AppendVarint(b, c.At)
	}
	if r.Policy != nil {
		b = appendPolicy(b, r.Policy)
	}
	return b
}

// Flags of a record's v1.2 tail.
const (
	recExpiredAt = 1 << iota
	recCheckpoint
	recPolicy
	recTombstoneSet
)

// DecodeRecord is the inverse of AppendRecord.
func DecodeRecord(frame []byte) (RecordKey, *Record, error) {
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
		flags := d.byte()
		if flags == 0 || flags&^(recTombstoneSet<<1-1) != 0 || (flags&recTombstoneSet != 0 && flags&recPolicy == 0) {
			d.fail("record tail flags")
		}
		if flags&recExpiredAt != 0 {
			if r.ExpiredAt = d.varint(); r.ExpiredAt == 0 {
				d.fail("record tail expired_at")
			}
		}
		if flags&recCheckpoint != 0 {
			c := &Checkpoint{Name: d.string()}
			if data := d.bytes(); len(data) > 0 {
				c.Data = append([]byte(nil), data...)
			}
			c.FencingToken = d.uvarint()
			c.At = d.varint()
			r.Checkpoint = c
		}
		if flags&recPolicy != 0 {
			r.Policy = d.policy(flags&recTombstoneSet != 0)
		}
	}
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes in record", ErrCorrupt, len(d.buf))
	}
	if d.err == nil && (r.State < StateInProgress || r.State > StatePartitions) {
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

	rs := f.store.BeginRestore()
	committed := false
	defer func() {
		if !committed {
			rs.Abort()
		}
	}()
	meta := Meta{Clock: clock, LastIndex: lastIndex}
	var frame []byte
	for i := uint64(0); i < count; i++ {
		n, err := binary.ReadUvarint(cr)
		if err != nil || n > MaxFrame {
			return fmt.Errorf("%w: record %d frame length", ErrCorrupt, i)
		}
		if uint64(cap(frame)) < n {
			frame = make([]byte, n)
		}
		frame = frame[:n]
		if _, err := io.ReadFull(cr, frame); err != nil {
			return fmt.Errorf("%w: record %d: %v", ErrCorrupt, i, err)
		}
		k, rec, err := DecodeRecord(frame)
		if err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		dup, err := rs.Has(k)
		if err != nil {
			return fmt.Errorf("fsm: restoring record %d: %w", i, err)
		}
		if dup {
			return fmt.Errorf("%w: record %d duplicates key %q", ErrCorrupt, i, k.Key)
		}
		if err := rs.Put(k, rec); err != nil {
			return fmt.Errorf("fsm: restoring record %d: %w", i, err)
		}
		meta.count(k, rec, +1)
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

	f.mu.Lock()
	defer f.mu.Unlock()
	if err := rs.Commit(meta); err != nil {
		return fmt.Errorf("fsm: switching to the restored state: %w", err)
	}
	committed = true
	f.meta = meta
	f.policies = loadPolicies(f.store)
	f.parts = loadPartTable(f.store)
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
