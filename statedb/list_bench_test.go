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
	db, err := Open(Config{Dir: b.TempDir(), CacheBytes: 64 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	sm, err := db.Shard("s1")
	if err != nil {
		b.Fatal(err)
	}
	const n = 100_000
	now := int64(1000) * sec
	idx := uint64(0)
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
