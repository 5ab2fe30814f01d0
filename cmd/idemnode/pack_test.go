package main

import (
	"testing"

	"github.com/idem-dev/idem/internal/cluster"
)

// With --raft-pack-commands (many commands per Raft entry) the promises
// hold as without: exactly one owner per key under concurrent reserves, and
// nothing acknowledged is lost when a leader is killed under load.
func TestPackedCommandsKeepPromises(t *testing.T) {
	c := startCluster(t, cluster.Spec{}, "--raft-pack-commands")
	testConcurrentReservesOneOwner(t, c)
	killLeaderUnderLoad(t, c)
}
