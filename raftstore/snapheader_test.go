package raftstore

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// TestSnapshotHeaderChecksum: a full snapshot's header (version 4) reads
// back its applied index; every single-bit flip in it is refused as
// ErrCorruptSnapshot (magic, version, index or checksum); version 1 (full,
// an older release's, no checksum) and version 2 (a reference) still read.
func TestSnapshotHeaderChecksum(t *testing.T) {
	const applied = 0x0102030405060708
	h := fullSnapHeader(applied)
	if len(h) != snapSummedLen {
		t.Fatalf("header of %d bytes, want %d", len(h), snapSummedLen)
	}
	rest := []byte("state")
	r := bytes.NewReader(append(append([]byte(nil), h...), rest...))
	v, got, err := readSnapHeader(r)
	if err != nil || v != snapVersionSummed || got != applied {
		t.Fatalf("readSnapHeader = %d, %d, %v; want version 4, %d", v, got, err, uint64(applied))
	}
	if after, _ := io.ReadAll(r); !bytes.Equal(after, rest) {
		t.Fatalf("readSnapHeader left %q, want the state %q", after, rest)
	}
	for bit := range len(h) * 8 {
		flipped := append([]byte(nil), h...)
		flipped[bit/8] ^= 1 << (bit % 8)
		v, got, err := readSnapHeader(bytes.NewReader(flipped))
		if !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("bit %d flipped: readSnapHeader = %d, %d, %v; want ErrCorruptSnapshot", bit, v, got, err)
		}
	}
	for _, version := range []byte{snapVersion, snapVersionRef} {
		v, got, err := readSnapHeader(bytes.NewReader(append(snapHeader(version, applied), rest...)))
		if err != nil || v != version || got != applied {
			t.Fatalf("version %d header: %d, %d, %v; want %d", version, v, got, err, uint64(applied))
		}
	}
	for _, bad := range [][]byte{nil, h[:9], h[:15], snapHeader(3, applied), snapHeader(5, applied), snapHeader(0, applied)} {
		if _, _, err := readSnapHeader(bytes.NewReader(bad)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("header %x: %v, want ErrCorruptSnapshot", bad, err)
		}
	}
}

// TestFSMAdapterRefusesADamagedHeader: a full snapshot whose header's
// applied index was flipped is refused before the state machine sees a
// byte of it, and the adapter's applied index stays; so is a reference
// snapshot, which carries no state.
func TestFSMAdapterRefusesADamagedHeader(t *testing.T) {
	m, err := newHostMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dst := newKV()
	a := newFSMAdapter(dst, m.forGroup("s0"))
	for name, stream := range map[string][]byte{
		"flipped applied index": append(func() []byte { h := fullSnapHeader(7); h[12] ^= 1; return h }(), "a=1"...),
		"reference":             snapHeader(snapVersionRef, 7),
	} {
		if err := a.Restore(io.NopCloser(bytes.NewReader(stream))); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("%s: Restore = %v, want ErrCorruptSnapshot", name, err)
		}
		if a.applied.Load() != 0 || a.restores.Load() != 0 {
			t.Fatalf("%s: applied %d, %d restores after a refused snapshot", name, a.applied.Load(), a.restores.Load())
		}
		if _, ok := dst.get("a"); ok {
			t.Fatalf("%s: the state machine got a record of a refused snapshot", name)
		}
	}
}
