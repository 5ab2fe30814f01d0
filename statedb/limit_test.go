package statedb

import (
	"errors"
	"testing"

	"github.com/idem-dev/idem/fsm"
)

// TestAdmitAtMaxState: at the limit, a reserve of a new key and a complete
// are refused with ErrStateFull; replays, reserves of held keys,
// heartbeats and releases pass; a sweep that frees space lets writes in
// again by itself.
func TestAdmitAtMaxState(t *testing.T) {
	db, err := Open(Config{Dir: t.TempDir(), CacheBytes: 8 << 20, MaxStateBytes: 9_000})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sm := openShard(t, db, "s")
	t0 := 1000 * sec
	idx := fill(t, sm, 0, 10, t0) // 10 completed records of ~1 KB: full
	if db.StateBytes() < 9_000 {
		t.Fatalf("state %d bytes, expected the limit to be reached", db.StateBytes())
	}
	idx++
	if r := sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "held", Now: t0, OwnerToken: "h", Lease: 60 * sec}); r.Outcome != fsm.OutcomeAcquired {
		t.Fatal(r.Outcome)
	}
	if err := sm.CommitApplied(idx); err != nil {
		t.Fatal(err)
	}
	now := t0 + sec/2 // nothing expired yet
	admit := func(c *fsm.Command) error { c.Now = now; return sm.Admit(c) }
	for _, tc := range []struct {
		name string
		cmd  *fsm.Command
		full bool
	}{
		{"reserve of a new key", &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "new", OwnerToken: "o", Lease: sec}, true},
		{"complete of a held key", &fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: "held", OwnerToken: "h", Retention: sec, Response: &fsm.Response{Status: 200}}, true},
		{"reserve that replays", &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "key-000005", OwnerToken: "x", Lease: sec}, false},
		{"retried complete", &fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: "key-000005", OwnerToken: "o", Retention: sec, Response: &fsm.Response{Status: 201}}, false},
		{"reserve of a held key", &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "held", OwnerToken: "other", Lease: sec}, false},
		{"heartbeat", &fsm.Command{Op: fsm.OpHeartbeat, Namespace: "ns", Key: "held", OwnerToken: "h", Lease: sec}, false},
		{"release", &fsm.Command{Op: fsm.OpRelease, Namespace: "ns", Key: "held", OwnerToken: "h"}, false},
		{"sweep", &fsm.Command{Op: fsm.OpSweep, MaxSweep: 10}, false},
	} {
		err := admit(tc.cmd)
		if tc.full != errors.Is(err, ErrStateFull) {
			t.Errorf("%s: Admit = %v, want full=%v", tc.name, err, tc.full)
		}
		var sf *StateFullError
		if tc.full && (!errors.As(err, &sf) || sf.Max != 9_000 || sf.Used < sf.Max) {
			t.Errorf("%s: error %v carries no figures", tc.name, err)
		}
	}
	// Retention of key-i is i+1 seconds: a sweep at t0+5s frees 5 records.
	idx++
	sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpSweep, Now: t0 + 5*sec})
	if err := sm.CommitApplied(idx); err != nil {
		t.Fatal(err)
	}
	now = t0 + 5*sec
	if err := admit(&fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: "new", OwnerToken: "o", Lease: sec}); err != nil {
		t.Fatalf("after a sweep freed space: %v", err)
	}
}
