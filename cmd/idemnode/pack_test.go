package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/node"
)

// With --raft-pack-commands (many commands per Raft entry) the promises
// hold as without: exactly one owner per key under concurrent reserves, and
// nothing acknowledged is lost when a leader is killed under load.
func TestPackedCommandsKeepPromises(t *testing.T) {
	c := startCluster(t, launch.Spec{}, "--raft-pack-commands")
	testConcurrentReservesOneOwner(t, c)
	killLeaderUnderLoad(t, c)
}

// metricWhere scrapes a node's /metrics and sums the samples of name whose
// line contains every one of labels (e.g. `le="1"`).
func metricWhere(t *testing.T, c *cluster.Cluster, id, name string, labels ...string) (sum float64, found bool) {
	t.Helper()
	resp, err := http.Get("http://" + c.HTTPAddr(id) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum, found = sum+v, true
	}
	return sum, found
}

// packedEntries is how many entries with more than one command the
// proposal buffers of all running nodes proposed (the
// idem_raft_proposal_entry_commands histogram: all minus those of one).
func packedEntries(t *testing.T, c *cluster.Cluster) float64 {
	t.Helper()
	var n float64
	for _, id := range nodeIDs(c) {
		all, _ := metricWhere(t, c, id, "idem_raft_proposal_entry_commands_count")
		one, _ := metricWhere(t, c, id, "idem_raft_proposal_entry_commands_bucket", `le="1"`)
		n += all - one
	}
	return n
}

// waitFor polls cond every 100ms until it holds; past a generous bound the
// test fails with what. (A bound on waiting, not a timed assertion.)
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still not the case after 60s: %s", what)
		}
	}
}

// packingShards is how many of id's shards pack (idem_raft_proposal_packing).
func packingShards(t *testing.T, c *cluster.Cluster, id string) float64 {
	v, _ := metricWhere(t, c, id, "idem_raft_proposal_packing")
	return v
}

// A region started with the defaults (--raft-pack-commands=auto) switches
// packing on in every shard once the cluster version reached packed
// entries, and packs under concurrent load.
func TestDefaultRegionPacks(t *testing.T) {
	c := startCluster(t, launch.Spec{})
	shards := float64(c.Topology.ShardsPerRegion) // every node votes in every shard
	for _, id := range nodeIDs(c) {
		waitFor(t, id+" packs in every shard", func() bool { return packingShards(t, c, id) == shards })
	}
	testConcurrentReservesOneOwner(t, c)
	if n := packedEntries(t, c); n == 0 {
		t.Fatal("48 concurrent reserves per key over 25 keys: no entry carried more than one command")
	} else {
		t.Logf("%v entries of more than one command", n)
	}
	// Some shard applied a packed entry on every replica (the 25 keys may
	// all fall into a few shards): its state is in packed token mode.
	for _, id := range nodeIDs(c) {
		waitFor(t, id+" applied a packed entry", func() bool {
			v, _ := metricWhere(t, c, id, "idem_fsm_packed_token_mode")
			return v >= 1
		})
	}
	for _, id := range nodeIDs(c) {
		if m := grepLines(mustRead(t, c.Nodes[id].Log), "shard packs commands into Raft entries from now on"); m == "" {
			t.Errorf("%s logged no switch to packing", id)
		}
	}
}

// One node runs with --raft-pack-commands=off, which advertises cluster
// version 1 (no packed entries) and, on the wire, the Clock answer of a
// release without packing: the simulated old release of a rolling upgrade.
// While it is in the cluster the cluster version stays 1 and no shard
// packs, though the other two advertise this release's; once it restarts
// with the defaults (upgraded), the cluster version rises and every shard
// packs. A data dir whose cluster version is above the release's is then
// refused (going back below the cluster version is not supported).
func TestOldVoterHoldsPackingBack(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	ids := nodeIDs(c)
	old := ids[2]
	c.Nodes[old].Args = append(c.Nodes[old].Args, "--raft-pack-commands=off")
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	peerVersion := func(at, peer string) (float64, bool) {
		return metricWhere(t, c, at, "idem_node_peer_version", `peer="`+peer+`"`)
	}
	clusterVersion := func(at string) float64 {
		v, _ := metricWhere(t, c, at, "idem_cluster_version")
		return v
	}
	// The version had its chance: each new node has answers from both
	// peers, the other new one advertising this release's, the old one 1;
	// and every node holds cluster version 1.
	for _, id := range ids[:2] {
		other := ids[1-slices.Index(ids, id)]
		waitFor(t, id+" heard both peers", func() bool {
			o, ok1 := peerVersion(id, old)
			n, ok2 := peerVersion(id, other)
			return ok1 && ok2 && o == node.VersionBaseline && n == node.ReleaseVersion
		})
	}
	for _, id := range ids {
		waitFor(t, id+" holds cluster version 1", func() bool { return clusterVersion(id) == node.VersionBaseline })
	}
	testConcurrentReservesOneOwner(t, c)
	for _, id := range ids {
		if p := packingShards(t, c, id); p != 0 {
			t.Errorf("%s packs in %v shards while %s (advertising 1) votes in all of them", id, p, old)
		}
		if v := clusterVersion(id); v != node.VersionBaseline {
			t.Errorf("%s: cluster version %v while %s advertises 1", id, v, old)
		}
	}
	if n := packedEntries(t, c); n != 0 {
		t.Fatalf("%v entries of more than one command while %s votes", n, old)
	}
	for _, id := range ids {
		if v, ok := metricWhere(t, c, id, "idem_fsm_packed_token_mode"); !ok || v != 0 {
			t.Errorf("%s: idem_fsm_packed_token_mode sums to %v (found %v), want 0 in every shard", id, v, ok)
		}
	}

	// The rolling upgrade's last step: the old node restarts on this release.
	if err := c.Nodes[old].Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.Nodes[old].Args = slices.DeleteFunc(c.Nodes[old].Args, func(a string) bool { return a == "--raft-pack-commands=off" })
	if err := c.Nodes[old].Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	shards := float64(c.Topology.ShardsPerRegion)
	for _, id := range ids {
		waitFor(t, id+" holds this release's cluster version", func() bool { return clusterVersion(id) == node.ReleaseVersion })
		waitFor(t, id+" packs in every shard after the upgrade", func() bool { return packingShards(t, c, id) == shards })
	}
	if rose := grepLines(mustRead(t, c.Nodes[ids[0]].Log), "cluster version rose"); rose == "" {
		t.Errorf("%s logged no rise of the cluster version", ids[0])
	}
	testConcurrentReservesOneOwner(t, c)
	if n := packedEntries(t, c); n == 0 {
		t.Fatal("after the upgrade: no entry carried more than one command")
	}

	// A release below the data dir's cluster version refuses to start. The
	// record stands in for a later release's cluster version.
	p := c.Nodes[old]
	if err := p.Stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	record := filepath.Join(c.Dir, "data", old, "cluster_version.json")
	if b, err := os.ReadFile(record); err != nil || !strings.Contains(string(b), fmt.Sprint(node.ReleaseVersion)) {
		t.Fatalf("the data dir's record of the cluster version: %q, %v", b, err)
	}
	if err := os.WriteFile(record, []byte(fmt.Sprintf(`{"cluster_version": %d}`, node.ReleaseVersion+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	line := lastLine(mustRefuse(t, p))
	for _, part := range []string{"cluster version", "not supported", fmt.Sprint(node.ReleaseVersion + 1)} {
		if !strings.Contains(line, part) {
			t.Fatalf("refusal line lacks %q: %s", part, line)
		}
	}
	t.Logf("refusal: %s", line)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
