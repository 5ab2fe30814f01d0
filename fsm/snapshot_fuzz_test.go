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
