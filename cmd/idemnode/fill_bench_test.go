package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

// BenchmarkNodeFill fills retained state through the API: a dev node (one node,
// four shards) retains IDEM_NODE_FILL_RECORDS completed records of 512-byte
// random bodies (default 1,000,000), filled by 64 gRPC clients doing
// reserve+complete cycles, and prints (stderr) at 0, 1M and 10M retained,
// over the next 100,000 cycles: cycles/s, the node's CPU time per cycle
// (user+system from process_cpu_seconds_total: the figure that does not
// move with whatever else shares the machine), RSS and data dir bytes per
// record. Then it kills the node (SIGKILL) and prints the time from restart
// to ready and the snapshots it restored (none expected). Run with
//
//	IDEM_NODE_FILL_RECORDS=10000000 go test -run XXX -bench NodeFill -benchtime 1x -timeout 3h ./cmd/idemnode
//
// IDEM_NODE_FILL_ARGS adds idemnode flags (e.g. "--pprof-addr 127.0.0.1:6060").
func BenchmarkNodeFill(b *testing.B) {
	total := 1_000_000
	if s := os.Getenv("IDEM_NODE_FILL_RECORDS"); s != "" {
		total, _ = strconv.Atoi(s)
	}
	const window = 100_000
	topo, err := launch.Topology(launch.Spec{Cluster: "fill", NodesPerRegion: 1, ShardsPerRegion: 4, Replicas: 1})
	if err != nil {
		b.Fatal(err)
	}
	args := append([]string{"--log-level", "warn"}, strings.Fields(os.Getenv("IDEM_NODE_FILL_ARGS"))...)
	c, err := cluster.NewNodes(topo, b.TempDir(), binaries.Path(b, "idemnode"), args...)
	if err != nil {
		b.Fatal(err)
	}
	c.StopOnCleanup(b)
	if err := c.StartAll(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 3*time.Hour)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	node := topo.Nodes()[0]
	cl, err := client.New(client.DefaultConfig(node.GRPCAddr))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	f := &cluster.Filler{Client: cl, Namespace: "fill"}
	run := func(n int) {
		if err := f.Run(ctx, n); err != nil {
			b.Fatal(err)
		}
	}
	id := node.ID
	dataDir := filepath.Join(c.Dir, "data", id)
	for _, cp := range []int{0, 1_000_000, 10_000_000} {
		if cp > total {
			break
		}
		run(cp - int(f.Done()))
		cpu0, t0 := metricSum(b, c, id, "process_cpu_seconds_total"), time.Now()
		run(window)
		took, cpu := time.Since(t0), metricSum(b, c, id, "process_cpu_seconds_total")-cpu0
		retained := f.Done()
		fmt.Fprintf(os.Stderr, "retained %9d: %6.0f cycles/s, node CPU %4.0f µs/cycle over the next %d | RSS %4.0f MiB | data dir %5.0f B/record | load %s\n",
			cp, window/took.Seconds(), cpu/window*1e6, window, metricSum(b, c, id, "process_resident_memory_bytes")/(1<<20),
			float64(dirSize(dataDir))/float64(retained), loadAvg())
	}
	if n := total - int(f.Done()); n > 0 {
		run(n)
	}
	p := c.Nodes[id]
	if err := p.Kill(); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "retained %9d: SIGKILL, restart to ready %v, snapshot restores %.0f, records %.0f, RSS %.0f MiB\n",
		f.Done(), time.Since(start).Round(time.Millisecond), metricSum(b, c, id, "idem_raft_snapshot_restores_total"),
		metricSum(b, c, id, "idem_fsm_records"), metricSum(b, c, id, "process_resident_memory_bytes")/(1<<20))
}

func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if len(b) < 4 {
		return "?"
	}
	return string(b[:4])
}
