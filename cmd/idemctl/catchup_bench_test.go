package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

// BenchmarkFollowerCatchUp measures a snapshot install under retained state:
// a three-node region (two shards, three replicas) retains
// IDEM_CATCHUP_RECORDS completed records of 512-byte bodies (default
// 100,000); one node is killed and loses its data dir, every leader
// snapshots and compacts its log, `idemctl replace-node` has the voter
// replaced, and the node starts empty and catches up by snapshot. It prints
// (stderr) the survivors' resident memory before, at its peak while the
// snapshot streams (sampled every 50 ms) and after, the engine bytes
// retained, and the time from its start until it holds every record. A leader that held the state
// in memory to send it would grow by the state's size. Run with
//
//	IDEM_CATCHUP_RECORDS=300000 go test -run XXX -bench FollowerCatchUp -benchtime 1x -timeout 30m ./cmd/idemctl
func BenchmarkFollowerCatchUp(b *testing.B) {
	records := 100_000
	if s := os.Getenv("IDEM_CATCHUP_RECORDS"); s != "" {
		records, _ = strconv.Atoi(s)
	}
	topo, err := launch.Topology(launch.Spec{Cluster: "catchup", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		b.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, b.TempDir(), binaries.Path(b, "idemnode"), "--raft-trailing-logs", "8", "--log-level", "warn")
	if err != nil {
		b.Fatal(err)
	}
	c.StopOnCleanup(b)
	if err := c.StartAll(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 25*time.Minute)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	var endpoints []string
	for _, n := range topo.Nodes() {
		endpoints = append(endpoints, n.GRPCAddr)
	}
	cl, err := client.New(client.DefaultConfig(endpoints...))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()

	start := time.Now()
	if err := (&cluster.Filler{Client: cl, Namespace: "fill", Retention: time.Hour}).Run(ctx, records); err != nil {
		b.Fatal(err)
	}
	fill := time.Since(start)
	fmt.Fprintf(os.Stderr, "filled %d records in %v (%.0f cycles/s)\n", records, fill.Round(time.Second), float64(records)/fill.Seconds())

	victim := topo.Nodes()[2].ID
	var survivors []string
	for _, n := range topo.Nodes() {
		if n.ID != victim {
			survivors = append(survivors, n.ID)
		}
	}
	metric := func(id, name string) float64 {
		v, _ := cluster.MetricSum(ctx, c.HTTPAddr(id), name) // 0 while a node is down
		return v
	}
	rss := func() map[string]float64 {
		out := map[string]float64{}
		for _, id := range survivors {
			out[id] = metric(id, "process_resident_memory_bytes")
		}
		return out
	}
	before := rss()
	stateBytes := metric(survivors[0], "idem_state_bytes")

	p := c.Nodes[victim]
	if err := p.Kill(); err != nil {
		b.Fatal(err)
	}
	dataDir := filepath.Join(c.Dir, "data", victim)
	for _, s := range topo.Shards() {
		mustCtl(b, "--config", c.TopologyPath, "snapshot", s.ID)
	}
	mustCtl(b, "--config", c.TopologyPath, "replace-node", "--id", victim, "--data-dir", dataDir)
	start = time.Now()
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	// Caught up: the replaced node is ready and holds every record (ready
	// alone can come first: a fresh replica knows no commit index yet).
	peak := map[string]float64{}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		for id, v := range rss() {
			peak[id] = max(peak[id], v)
		}
		if metric(victim, "idem_fsm_records") >= float64(records) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the replaced node holds %.0f records after 10 minutes, want %d", metric(victim, "idem_fsm_records"), records)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(start)
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if err := launch.WaitHTTP(rctx, "http://"+c.HTTPAddr(victim)+"/readyz"); err != nil {
		b.Fatal(err)
	}
	after := rss()
	restores := metric(victim, "idem_raft_snapshot_restores_total")
	if restores == 0 {
		b.Fatal("the replaced node restored no snapshot")
	}
	fmt.Fprintf(os.Stderr, "state on a survivor: %.0f MiB (idem_state_bytes) in %d records; replaced node held every record %v after its start, with %v snapshot restores\n",
		stateBytes/(1<<20), records, took.Round(time.Millisecond), restores)
	for _, id := range survivors {
		fmt.Fprintf(os.Stderr, "survivor %s RSS: before %.0f MiB, peak during catch-up %.0f MiB, after %.0f MiB\n",
			id, before[id]/(1<<20), peak[id]/(1<<20), after[id]/(1<<20))
	}
	fmt.Fprintf(os.Stderr, "records: survivor %.0f, replaced node %.0f\n", metric(survivors[0], "idem_fsm_records"), metric(victim, "idem_fsm_records"))
}
