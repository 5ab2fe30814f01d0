package statedb

import (
	"fmt"
	"testing"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/topology"
)

// BenchmarkScanPartitions measures one batch's scan of the partition index
// (what a handoff's export and its reset import each do) over a shard of
// 50,000 records (a fifth completed) in the default ring's partitions: a
// batch of 128 and one of 512 partitions (the most a batch has).
//
//	go test -run XXX -bench ScanPartitions -benchtime 200x ./statedb
func BenchmarkScanPartitions(b *testing.B) {
	const count = topology.DefaultPartitionCount
	sm := benchShard(b, count)
	all := make([]uint32, count)
	for p := range all {
		all[p] = uint32(p)
	}
	now := int64(1000) * sec
	idx := uint64(1)
	sm.FSM().Apply(idx, &fsm.Command{Op: fsm.OpAdopt, Now: now, Handoff: &fsm.Handoff{Count: count, Partitions: all}})
	const n = 50_000
	fillShard(b, sm, idx, n, now)
	for _, size := range []int{128, 512} {
		b.Run(fmt.Sprintf("%d-partitions", size), func(b *testing.B) {
			parts := all[1000 : 1000+size]
			records := 0
			for b.Loop() {
				records = 0
				if err := sm.FSM().ExportPartitions(count, parts, func(fsm.KeyedRecord) bool { records++; return true }); err != nil {
					b.Fatal(err)
				}
			}
			if want := n * size / count; records < want/2 || records > want*2 {
				b.Fatalf("%d records in %d partitions, expected about %d", records, size, want)
			}
			b.ReportMetric(float64(records), "records/op")
		})
	}
}
