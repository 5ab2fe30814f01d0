package raftstore

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
)

// TestReplicationIsNotPipelined: leaders replicate with one AppendEntries in
// flight (DESIGN.md, "Replication without pipelining"). With pipelining on,
// a leader that replicated successfully switches each follower to a
// pipelineReplicate goroutine, which this test would find.
func TestReplicationIsNotPipelined(t *testing.T) {
	t.Parallel()
	c := newTestCluster(t, 3, []string{"p1"}, nil)
	want := map[string]string{}
	for i := range 30 {
		k := fmt.Sprintf("k%d", i)
		c.put("p1", k, "v")
		want[k] = "v"
	}
	c.waitReplicated("p1", want, []int{0, 1, 2})
	buf := make([]byte, 16<<20)
	n := runtime.Stack(buf, true)
	if bytes.Contains(buf[:n], []byte("raft.(*Raft).pipelineReplicate")) {
		t.Fatal("a leader replicates through a pipeline: MaxRPCsInFlight must stay 1")
	}
}
