package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// giantNodesPerRegion makes the giant target about half a megabyte.
const giantNodesPerRegion = 2500

// cpuTicks is process pid's user + system CPU time in clock ticks
// (/proc/PID/stat, 100 per second).
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// TestGiantRefusedTopologyCostsNobody performs, on a secure region, the
// refused giant topology: a PUT /v1/topology of a target of two regions of
// 256 shards and 2500 nodes each (about half a megabyte) naming a dead
// node that does not exist. Before, it answered 503 after 3.2 s, cost about 1.7 s of CPU on
// every node and stayed in the meta log. Now the meta leader refuses it
// before proposing: 400 INVALID_ARGUMENT. The time and each node's CPU are
// logged.
func TestGiantRefusedTopologyCostsNobody(t *testing.T) {
	c := startSecureCluster(t, launch.Spec{Cluster: "giant", Regions: []string{"east"}, NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3},
		"principals:\n  - {name: root, namespaces: [\"*\"], role: admin}\n", "root")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	api, err := c.API(c.Topology.Nodes()[0].HTTPAddr, "root")
	if err != nil {
		t.Fatal(err)
	}
	giant := c.Topology.Clone()
	giant.Version = 2
	giant.ShardsPerRegion = 256
	giant.Regions = append(giant.Regions, topology.Region{Name: "west"})
	for r := range giant.Regions {
		region := &giant.Regions[r]
		for i := len(region.Nodes); i < giantNodesPerRegion; i++ {
			region.Nodes = append(region.Nodes, topology.Node{ID: fmt.Sprintf("%s-extra-%d", region.Name, i), Region: region.Name,
				RaftAddr: fmt.Sprintf("10.%d.%d.%d:7000", r, i/250, i%250), GRPCAddr: fmt.Sprintf("10.%d.%d.%d:7070", r, i/250, i%250),
				HTTPAddr: fmt.Sprintf("10.%d.%d.%d:8080", r, i/250, i%250)})
		}
	}
	body := map[string]any{"topology": giant, "dead": []string{"ghost-9"}}
	raw, _ := json.Marshal(body)
	cpu := map[string]int64{}
	for id, p := range c.Nodes {
		cpu[id] = cpuTicks(t, p.Pid())
	}
	start := time.Now()
	r, err := api.Do(ctx, "PUT", "/v1/topology", raw)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for id, p := range c.Nodes {
		used = append(used, fmt.Sprintf("%s %d ms", id, (cpuTicks(t, p.Pid())-cpu[id])*10))
	}
	t.Logf("PUT /v1/topology of %d bytes (2 regions x 256 shards x %d nodes, dead node that does not exist): %d after %v; CPU: %s; %s",
		len(raw), giantNodesPerRegion, r.Status, took.Round(time.Millisecond), strings.Join(used, ", "), r.Raw)
	if r.Status != http.StatusBadRequest || r.ErrCode() != "INVALID_ARGUMENT" {
		t.Fatalf("giant refused topology: %s, want 400 INVALID_ARGUMENT", r)
	}
}
