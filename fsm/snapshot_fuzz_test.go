package fsm

import (
	"bytes"
	"errors"
	"testing"
)

// fuzzSnapshot returns the snapshot bytes of an FSM that applied cmds.
func fuzzSnapshot(tb testing.TB, cmds []*Command) []byte {
	f := New()
	for i, c := range cmds {
		f.Apply(uint64(i+1), c)
	}
	var b bytes.Buffer
	if _, err := f.Snapshot().WriteTo(&b); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

// FuzzRestore feeds arbitrary bytes to the snapshot restorer, as a corrupt
// or forged InstallSnapshot would: it must never panic; a rejected stream
// leaves the FSM as it was; an accepted one is a state that snapshots to
// the same bytes again (replicas that restore it agree) and keeps applying.
func FuzzRestore(f *testing.F) {
	f.Add(fuzzSnapshot(f, nil))
	f.Add(fuzzSnapshot(f, fuzzCommands()))
	f.Add(fuzzSnapshot(f, fuzzCommands()[:1]))
	f.Fuzz(func(t *testing.T, data []byte) {
		fm := New()
		fm.Apply(1, fuzzCommands()[0])
		var before bytes.Buffer
		fm.Snapshot().WriteTo(&before)
		if err := fm.Restore(bytes.NewReader(data)); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Restore error %v does not wrap ErrCorrupt", err)
			}
			var after bytes.Buffer
			fm.Snapshot().WriteTo(&after)
			if !bytes.Equal(before.Bytes(), after.Bytes()) {
				t.Fatal("a rejected snapshot changed the FSM")
			}
			return
		}
		var first bytes.Buffer
		if _, err := fm.Snapshot().WriteTo(&first); err != nil {
			t.Fatal(err)
		}
		other := New()
		if err := other.Restore(bytes.NewReader(first.Bytes())); err != nil {
			t.Fatalf("restoring a snapshot of an accepted state: %v", err)
		}
		var second bytes.Buffer
		other.Snapshot().WriteTo(&second)
		if !bytes.Equal(first.Bytes(), second.Bytes()) {
			t.Fatal("two replicas restoring the same state snapshot it differently")
		}
		if last := fm.Stats().LastIndex; last < 1<<63 {
			for i, c := range fuzzCommands() {
				fm.Apply(last+1+uint64(i), c)
			}
		}
	})
}

// TestEverySingleBitFlipIsRefused: the stream's CRC-32C trailer covers
// every byte before it, so any single flipped bit of a snapshot (header,
// frame lengths, records, the trailer itself) is refused with ErrCorrupt
// and leaves the FSM as it was: never a partial or altered state.
func TestEverySingleBitFlipIsRefused(t *testing.T) {
	// Three completed records with headers and bodies, one in progress.
	var cmds []*Command
	for _, k := range []string{"a", "b", "c"} {
		cmds = append(cmds,
			&Command{Op: OpReserve, Namespace: "pay", Key: "order-" + k, Now: 5, OwnerToken: "owner-" + k, Lease: 30e9},
			&Command{Op: OpComplete, Namespace: "pay", Key: "order-" + k, Now: 6, OwnerToken: "owner-" + k, Retention: 86400e9,
				Response: &Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"order":"` + k + `"}`)}})
	}
	cmds = append(cmds, fuzzCommands()[0])
	snap := fuzzSnapshot(t, cmds)
	if len(snap) > 8<<10 {
		t.Fatalf("snapshot of %d bytes: too large to flip every bit", len(snap))
	}
	fm := New()
	fm.Apply(1, fuzzCommands()[0])
	var before bytes.Buffer
	fm.Snapshot().WriteTo(&before)
	flipped := make([]byte, len(snap))
	for bit := range len(snap) * 8 {
		copy(flipped, snap)
		flipped[bit/8] ^= 1 << (bit % 8)
		if err := fm.Restore(bytes.NewReader(flipped)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("bit %d of %d flipped: Restore = %v, want ErrCorrupt", bit, len(snap)*8, err)
		}
	}
	var after bytes.Buffer
	fm.Snapshot().WriteTo(&after)
	if !bytes.Equal(before.Bytes(), after.Bytes()) {
		t.Fatal("a refused snapshot changed the FSM")
	}
	if err := fm.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("the undamaged snapshot: %v", err)
	}
	t.Logf("%d single-bit flips of a %d-byte snapshot refused", len(snap)*8, len(snap))
}
