package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
)

// TestRouterRefusesAnotherRing: a router whose topology gives another ring
// than the one the running cluster was created with refuses to start, with
// one clear line, instead of sending keys to shards that do not hold them.
func TestRouterRefusesAnotherRing(t *testing.T) {
	topo, err := launch.Topology(launch.Spec{Regions: []string{"r1"}, NodesPerRegion: 1, Replicas: 1, ShardsPerRegion: 2})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// Another ring section places every key in another partition. (A file
	// with another shard set or voters is a version of the cluster's
	// topology, which routers follow.)
	changed := topo.Clone()
	changed.Ring.PartitionCount = 1031
	path := filepath.Join(t.TempDir(), "changed.yaml")
	if err := launch.WriteTopology(changed, path); err != nil {
		t.Fatal(err)
	}
	ports, _ := launch.FreePorts(2)
	cmd := exec.CommandContext(ctx, binaries.Path(t, "idemrouter"), "--config", path, "--region", "r1",
		"--http-addr", "127.0.0.1:"+itoa(ports[0]), "--grpc-addr", "127.0.0.1:"+itoa(ports[1]))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("router started with a changed ring; output:\n%s", out)
	}
	last := strings.TrimSpace(string(out))
	last = last[strings.LastIndex(last, "\n")+1:]
	if !strings.HasPrefix(last, "idemrouter:") || !strings.Contains(last, "does not match the cluster's ring") {
		t.Fatalf("want one clear line about the ring, got:\n%s", out)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
