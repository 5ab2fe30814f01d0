package main

import "testing"

// A node's /metrics carries the metadata group's series beside the data
// shards'; only the data shards count towards the leader balance.
func TestShardsLedSkipsMetaGroup(t *testing.T) {
	text := `# HELP idem_raft_leader 1 if this node leads the shard.
# TYPE idem_raft_leader gauge
idem_raft_leader{shard="meta"} 1
idem_raft_leader{shard="us-east-0"} 0
idem_raft_leader{shard="us-east-2"} 1
idem_raft_leader{shard="us-east-3"} 1
idem_raft_leader_changes_total{shard="us-east-3"} 7
idem_raft_state{shard="us-east-2"} 2
`
	led, err := shardsLed(text)
	if err != nil {
		t.Fatal(err)
	}
	if led != 2 {
		t.Fatalf("shardsLed = %d, want 2 (us-east-2 and us-east-3; not meta, not other metrics)", led)
	}
	if _, err := shardsLed("idem_raft_leader{shard=\"us-east-0\"} x\n"); err == nil {
		t.Fatal("a malformed value was accepted")
	}
}
