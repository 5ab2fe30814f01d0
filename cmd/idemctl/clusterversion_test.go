package main

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
)

// A change that moves keys between shards waits while the cluster version
// is below partition handoff: one node runs with --raft-pack-commands=off
// (it advertises cluster version 1, as an old release would), and the meta
// group's leader moves no partition and logs why, naming that node. Once
// the node restarts with the defaults (upgraded) the cluster version rises
// and the change completes by itself.
func TestReshardWaitsForClusterVersion(t *testing.T) {
	spec := launch.Spec{Cluster: "cv", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3}
	old := "r1-3"
	c, dir, _ := startNodes(t, spec, "", 4*time.Minute, map[string][]string{old: {"--raft-pack-commands=off"}})
	topo := c.Topology
	v1 := c.TopologyPath
	grown := topo.Clone()
	grown.ShardsPerRegion = 4
	v2 := nextVersion(t, grown, 2, dir)
	mustCtl(t, "--config", v1, "topology", "apply", v2, "--no-wait")

	logs := func(substr ...string) string {
		for _, nd := range topo.Nodes() {
			data, _ := os.ReadFile(c.Nodes[nd.ID].Log)
			for _, line := range strings.Split(string(data), "\n") {
				if !slices.ContainsFunc(substr, func(s string) bool { return !strings.Contains(line, s) }) {
					return line
				}
			}
		}
		return ""
	}
	var waiting string
	testutil.Until(t, 90*time.Second, "the mover waiting for the cluster version", func() bool {
		waiting = logs("topology change: waiting", "cluster version 1", old)
		return waiting != ""
	})
	t.Logf("waiting: %s", waiting)
	if moved := logs("partitions moved"); moved != "" {
		t.Fatalf("partitions moved while %s advertises cluster version 1: %s", old, moved)
	}
	// idemctl says why the change waits, without the nodes' logs.
	var status string
	testutil.Until(t, 30*time.Second, "topology status saying the change waits for the cluster version, held back by "+old, func() bool {
		status = mustCtl(t, "--config", v1, "topology", "status")
		return strings.Contains(status, "waiting: cluster version 1") && strings.Contains(status, "held back by "+old+" (advertises 1)")
	})
	t.Logf("topology status while waiting:\n%s", status)
	st := decode[clusterView](t, mustCtl(t, "--config", v1, "status", "--json"))
	if st.ClusterVersion != 1 {
		t.Fatalf("status: cluster version %d while %s advertises 1", st.ClusterVersion, old)
	}

	// The upgrade's last step: the old node restarts with the defaults.
	if err := c.Nodes[old].Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.Nodes[old].Args = slices.DeleteFunc(c.Nodes[old].Args, func(a string) bool { return a == "--raft-pack-commands=off" })
	if err := c.Nodes[old].Start(); err != nil {
		t.Fatal(err)
	}
	out := mustCtlWithin(t, 3*time.Minute, "--config", v1, "--timeout", "10s", "topology", "apply", v2)
	t.Logf("apply v2 after the upgrade:\n%s", out)
	if logs("partitions moved") == "" {
		t.Fatal("the change completed without moving a partition")
	}
	st = decode[clusterView](t, mustCtl(t, "--config", v2, "status", "--json"))
	if st.ClusterVersion < 3 {
		t.Fatalf("status after the upgrade: cluster version %d", st.ClusterVersion)
	}
}
