package statedb

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/idem-dev/idem/fsm"
)

// BenchmarkApplyCycle is one reserve and one complete (512-byte body) of a
// new key applied to a shard's state machine, committed every 64
// commands as a busy ApplyBatch would: the state engine's share of a
// cycle, in time and allocations (go test ./statedb -run - -bench
// ApplyCycle -benchmem).
func BenchmarkApplyCycle(b *testing.B) {
	db, err := Open(Config{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	sm, err := db.Shard("bench-0")
	if err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 512)
	for i := range body {
		body[i] = byte(i * 7)
	}
	const retention, commitEvery = int64(3600e9), 64
	idx := uint64(0)
	step := func(cmd *fsm.Command, want fsm.Outcome) {
		idx++
		if r := sm.FSM().Apply(idx, cmd); r.Outcome != want {
			b.Fatalf("apply %d (%v): outcome %v, want %v", idx, cmd.Op, r.Outcome, want)
		}
		if idx%commitEvery == 0 {
			if err := sm.CommitApplied(idx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("%08x-4c7e-4b1a-9d7e-%012d", i*2654435761, i)
		owner := "owner-" + strconv.Itoa(i)
		now := int64(1e18) + int64(i)*1000
		step(&fsm.Command{Op: fsm.OpReserve, Namespace: "orders", Key: key, Now: now, OwnerToken: owner, Fingerprint: "sha256:abcdef", Lease: 30e9}, fsm.OutcomeAcquired)
		step(&fsm.Command{Op: fsm.OpComplete, Namespace: "orders", Key: key, Now: now, OwnerToken: owner, Retention: retention,
			Response: &fsm.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: body}}, fsm.OutcomeOK)
	}
}
