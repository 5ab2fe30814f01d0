package raftstore

import (
	"errors"
	"io"
	"testing"

	"github.com/hashicorp/raft"
)

// failingDurable is a kvSM whose CommitApplied fails from the n-th call on.
type failingDurable struct {
	*kvSM
	commits, failFrom int
}

func (d *failingDurable) AppliedIndex() uint64 { return 0 }
func (d *failingDurable) CommitApplied(uint64) error {
	d.commits++
	if d.commits >= d.failFrom {
		return errors.New("pebble: write failed: no space left on device")
	}
	return nil
}
func (d *failingDurable) RestoreApplied(r io.Reader, _ uint64) error { return d.Restore(r) }

// TestDurableCommitFailureStopsApplying: when the durable state machine
// cannot commit an applied batch, the adapter reports ErrStorageFailed once
// (the node exits on it) and applies nothing more on top of the broken
// state, answering every later entry with that error instead of a result.
func TestDurableCommitFailureStopsApplying(t *testing.T) {
	m, err := newHostMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sm := &failingDurable{kvSM: newKV(), failFrom: 2}
	a := newFSMAdapter(sm, m.forGroup("s0"))
	var reported []error
	a.onFail = func(err error) { reported = append(reported, err) }
	batch := func(from uint64, data ...string) []any {
		var logs []*raft.Log
		for i, d := range data {
			logs = append(logs, &raft.Log{Index: from + uint64(i), Type: raft.LogCommand, Data: []byte(d)})
		}
		return a.ApplyBatch(logs)
	}
	if out := batch(1, "a=1"); out[0].(kvResult).Key != "a" {
		t.Fatalf("first batch: %v", out)
	}
	batch(2, "b=2") // its commit fails: reported
	if len(reported) != 1 || !errors.Is(reported[0], ErrStorageFailed) {
		t.Fatalf("reported %v, want one ErrStorageFailed", reported)
	}
	applied, _ := sm.counts()
	out := batch(3, "c=3", "d=4")
	for i, o := range out {
		if err, ok := o.(error); !ok || !errors.Is(err, ErrStorageFailed) {
			t.Fatalf("entry %d after the failure answered %v, want ErrStorageFailed", i, o)
		}
	}
	if now, _ := sm.counts(); now != applied {
		t.Fatalf("%d commands applied on top of the failed state", now-applied)
	}
	if len(reported) != 1 {
		t.Fatalf("failure reported %d times, want once", len(reported))
	}
}
