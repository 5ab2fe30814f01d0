package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// TestDevDataDirKeepsItsShape: a dev node starts with one shard, and a dev
// data dir made when the embedded default had four shards keeps its four
// on the new binary: the stored shape, not the embedded one, places the
// keys, so every key reserved before the upgrade is still found
// IN_PROGRESS by a retry after it (none is reserved a second time).
func TestDevDataDirKeepsItsShape(t *testing.T) {
	ports, err := launch.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	httpAddr, grpcAddr, raftAddr := "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1]), "127.0.0.1:"+strconv.Itoa(ports[2])
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	bin := binaries.Path(t, "idemnode")

	// The dev topology as releases before this one built it: four shards.
	old := devTopology(raftAddr, grpcAddr, httpAddr)
	if old.ShardsPerRegion != 1 {
		t.Fatalf("the embedded dev topology has %d shards, want 1", old.ShardsPerRegion)
	}
	old.ShardsPerRegion = 4
	file := filepath.Join(dir, "dev4.yaml")
	if err := launch.WriteTopology(old, file); err != nil {
		t.Fatal(err)
	}
	api := cluster.NewAPI(httpAddr)
	api.RetryUnavailable = 30 * time.Second
	start := func(name, data string, args ...string) *launch.Process {
		t.Helper()
		p := &launch.Process{Name: name, Bin: bin, Log: filepath.Join(dir, name+".log"), Args: append(args, "--data-dir", data)}
		t.Cleanup(func() { p.Kill() })
		startReady(t, p, httpAddr)
		return p
	}
	// groups waits until the node leads want Raft groups (its shards and
	// the metadata group): a one-node group elects itself at once.
	groups := func(p *launch.Process, want float64) {
		t.Helper()
		var got float64
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if got, err = cluster.MetricSum(t.Context(), httpAddr, "idem_raft_leader"); err == nil && got == want {
				return
			}
		}
		log, _ := os.ReadFile(p.Log)
		t.Fatalf("the node leads %v Raft groups (%v), want %v\n%s", got, err, want, log)
	}
	reserve := func(key string) cluster.Reply {
		t.Helper()
		r, err := api.Do(t.Context(), "POST", cluster.KeyPath("ns", key)+":reserve", map[string]any{"fingerprint": "f", "lease_ms": 600000})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != 200 {
			t.Fatalf("reserve %s: %s", key, r)
		}
		return r
	}

	// A fresh dev node: one shard and the metadata group.
	fresh := start("fresh", filepath.Join(dir, "fresh"), "--dev", "--http-addr", httpAddr, "--grpc-addr", grpcAddr, "--raft-addr", raftAddr)
	groups(fresh, 2)
	if err := fresh.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}

	// The old dev node: four shards; 32 keys spread over them.
	p := start("dev4", data, "--config", file, "--id", "dev")
	groups(p, 5)
	const keys = 32
	for i := range keys {
		if r := reserve(fmt.Sprint("k", i)); r.Str("outcome") != "ACQUIRED" {
			t.Fatalf("first reserve of k%d: %s", i, r)
		}
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}

	// The new binary's --dev on the same dir runs the stored four shards.
	p = start("dev", data, "--dev", "--http-addr", httpAddr, "--grpc-addr", grpcAddr, "--raft-addr", raftAddr)
	groups(p, 5)
	for i := range keys {
		if r := reserve(fmt.Sprint("k", i)); r.Str("outcome") != "IN_PROGRESS" {
			t.Fatalf("retry of k%d after the upgrade: %s, want IN_PROGRESS (the key was reserved before it)", i, r)
		}
	}
}

// TestDevTopologyFiles: the two files that describe a dev node (the one a
// router in front of `idemnode --dev` uses, and the one the container image
// runs) have the embedded dev topology's shape: cluster, shard count,
// replication, survival, region and node.
func TestDevTopologyFiles(t *testing.T) {
	want := devTopology("127.0.0.1:7000", "127.0.0.1:7070", "127.0.0.1:8080")
	for _, path := range []string{"../../deploy/examples/dev.yaml", "../../deploy/docker/dev.yaml"} {
		got, err := topology.LoadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.Cluster != want.Cluster || got.ShardsPerRegion != want.ShardsPerRegion || got.Replicas != want.Replicas || got.Survival != want.Survival {
			t.Errorf("%s: cluster %q, %d shards, %d replicas, %s survival; --dev has %q, %d, %d, %s", path,
				got.Cluster, got.ShardsPerRegion, got.Replicas, got.Survival, want.Cluster, want.ShardsPerRegion, want.Replicas, want.Survival)
		}
		if len(got.Regions) != 1 || got.Regions[0].Name != want.Regions[0].Name || len(got.Regions[0].Nodes) != 1 || got.Regions[0].Nodes[0].ID != want.Regions[0].Nodes[0].ID {
			t.Errorf("%s: regions %+v; --dev has one region %q with one node %q", path, got.Regions, want.Regions[0].Name, want.Regions[0].Nodes[0].ID)
		}
	}
}
