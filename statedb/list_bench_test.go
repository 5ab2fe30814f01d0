package statedb

import (
	"fmt"
	"testing"

	"github.com/idem-dev/idem/fsm"
)

// BenchmarkListPage measures one listing page of 1000 keys (and one that
// examines 4096 records and matches none: the bounded worst case) over a
// shard of 100,000 records on disk. A page takes only the FSM's read lock,
// for its clock; its cost is one engine iterator over the records it shows.
//
//	go test -run XXX -bench ListPage -benchtime 200x ./statedb
func BenchmarkListPage(b *testing.B) {
	sm := benchShard(b, 0)
	const n = 100_000
	now := int64(1000) * sec
	fillShard(b, sm, 0, n, now)
	for _, c := range []struct {
		name string
		q    fsm.ListQuery
	}{
		{"1000-keys", fsm.ListQuery{Namespace: "ns", Limit: 1000, MaxScan: 4096}},
		{"4096-examined-none-match", fsm.ListQuery{Namespace: "ns", CreatedBefore: 1, Limit: 1000, MaxScan: 4096}},
	} {
		b.Run(c.name, func(b *testing.B) {
			after := ""
			for b.Loop() {
				q := c.q
				q.After = after
				p, err := sm.FSM().List(q, now)
				if err != nil {
					b.Fatal(err)
				}
				if after = p.Last; p.Done {
					after = ""
				}
			}
		})
	}
}

// fillShard reserves n keys ns/key-%07d in sm from log index idx on,
// completes every fifth (a 512-byte response) and commits every 1000.
func fillShard(b *testing.B, sm *StateMachine, idx uint64, n int, now int64) {
	b.Helper()
	for i := range n {
		idx++
		res := sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpReserve, Namespace: "ns", Key: fmt.Sprintf("key-%07d", i), Now: now,
			OwnerToken: "owner-token-000001", Lease: 60 * sec})
		if res.Outcome != fsm.OutcomeAcquired {
			b.Fatalf("reserve %d: %v", i, res.Outcome)
		}
		if i%5 == 0 {
			idx++
			sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpComplete, Namespace: "ns", Key: fmt.Sprintf("key-%07d", i), Now: now,
				OwnerToken: "owner-token-000001", Retention: 3600 * sec, Response: &fsm.Response{Status: 200, Body: make([]byte, 512)}})
		}
		if i%1000 == 999 {
			if err := sm.CommitApplied(idx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := sm.CommitApplied(idx); err != nil {
		b.Fatal(err)
	}
}

// benchShard opens shard s1 of a DB in a temporary dir (with a partition
// index for partitions, if not 0), closed when b ends.
func benchShard(b *testing.B, partitions uint32) *StateMachine {
	b.Helper()
	db, err := Open(Config{Dir: b.TempDir(), CacheBytes: 64 << 20, PartitionCount: partitions})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return openShard(b, db, "s1")
}
