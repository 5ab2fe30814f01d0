package regionsim

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/regionsim/wan"
	"github.com/idem-dev/idem/topology"
)

// TestRaftCrossesTheWAN starts a region-survival cluster (every shard has a
// voter in each region) and cuts one region off. If Raft bypassed the WAN
// proxies, the isolated region's leaders would keep leading; they must step
// down, and every shard must stay writable from the other regions (the
// promise of region survival).
func TestRaftCrossesTheWAN(t *testing.T) {
	needBinaries(t)
	cfg := DefaultConfig()
	cfg.Survival = "region"
	cfg.Compare = false
	cfg.LatencyMin, cfg.LatencyMax = 20*time.Millisecond, 40*time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	c, err := startCluster(ctx, cfg, t.TempDir(), bins, testutil.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.close(); err != nil {
			t.Errorf("stopping: %v", err)
		}
		if t.Failed() {
			dumpLogs(t, c)
		}
	}()
	ring, err := topology.NewRing(c.topo)
	if err != nil {
		t.Fatal(err)
	}
	// One key per shard.
	keys := map[string]string{}
	for i := 0; len(keys) < len(ring.Shards()) && i < 100000; i++ {
		k := fmt.Sprintf("probe-%d", i)
		if s := ring.Locate(namespace, k); keys[s.ID] == "" {
			keys[s.ID] = k
		}
	}
	isolated := c.regions[0]
	// Make sure the isolated region leads something before the cut.
	if led := c.transferLeadership(ctx, c.nodesIn(isolated)[0]); led == 0 {
		t.Fatalf("could not move any leadership to %s", c.nodesIn(isolated)[0])
	}
	if err := c.net.Isolate(isolated, wan.Refuse); err != nil {
		t.Fatal(err)
	}
	var leaders map[string]string
	deadline := time.Now().Add(30 * time.Second)
	for {
		leaders = c.shardLeaders(ctx)
		inIsolated := 0
		for _, id := range leaders {
			if c.node(id).region == isolated {
				inIsolated++
			}
		}
		if inIsolated == 0 && len(leaders) == len(ring.Shards()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with %s cut off, leaders are still %v: Raft does not go through the simulated WAN", isolated, leaders)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cl, err := client.New(client.Config{Endpoints: []string{c.via[c.regions[1]][c.regions[1]]}, MaxAttempts: 5, RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for shard, key := range keys {
		res, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: namespace, Key: key})
		if err != nil || !res.Outcome.Owned() {
			t.Fatalf("shard %s (key %s) not writable from %s with %s cut off: %+v %v", shard, key, c.regions[1], isolated, res, err)
		}
	}
	if err := c.heal(ctx); err != nil {
		t.Fatal(err)
	}
}

// dumpLogs logs the tail of every process log.
func dumpLogs(t *testing.T, c *simCluster) {
	t.Helper()
	for _, id := range c.ids() {
		data, _ := os.ReadFile(c.node(id).proc.Log)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		t.Logf("---- tail of %s ----\n%s", id, data)
	}
}

// TestInterruptStopsEverything: a run cancelled in the middle of a
// scenario returns promptly and leaves no process of its own behind.
func TestInterruptStopsEverything(t *testing.T) {
	cfg := shortConfig(t)
	cfg.Scenarios = []string{"leader-kill"}
	cfg.Duration = 30 * time.Second
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		// Cancel once the scenario is under way: its first fault killed a
		// node (down for at least 2 s), so the number of processes under the
		// work dir fell below the most seen (every process started) and
		// stayed there for three polls. One poll is not enough: a process's
		// cmdline can read empty for the instant of an exec (the servers
		// re-executed themselves at start in earlier builds; a launcher
		// that execs may still).
		deadline := time.Now().Add(2 * time.Minute)
		most, below := 0, 0
		for time.Now().Before(deadline) {
			n := len(processesUnder(cfg.WorkDir))
			if most > 0 && n < most {
				if below++; below == 3 {
					cancel()
					return
				}
			} else {
				below = 0
			}
			most = max(most, n)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	started := time.Now()
	rep, err := Run(ctx, cfg)
	if err == nil {
		t.Fatal("an interrupted run returned no error")
	}
	if rep == nil || len(rep.Scenarios) != 1 || rep.Scenarios[0].Error == "" || rep.Passed {
		t.Fatalf("report of an interrupted run: %+v", rep)
	}
	if took := time.Since(started); took > 90*time.Second {
		t.Errorf("the interrupted run took %s to return", took)
	}
	if left := processesUnder(cfg.WorkDir); len(left) > 0 {
		t.Fatalf("processes left running after the interrupt: %v", left)
	}
}

// processesUnder lists the pids of running processes whose command line
// mentions dir (every process regionsim starts has its data dir there).
func processesUnder(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		stat, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		if strings.Contains(string(cmdline), dir) && !strings.Contains(string(stat), ") Z ") {
			out = append(out, e.Name())
		}
	}
	return out
}
