package raftstore

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestElectionStabilitySoak measures election flapping: 3 nodes x 12 groups
// under a steady write load, counting leader changes after the initial
// elections. It backs the timeout choices in DESIGN.md. Opt in with
//
//	IDEM_RAFT_SOAK=60s IDEM_RAFT_SOAK_TIMEOUTS=default|test|medium|fast go test -race -run Soak ./raftstore
func TestElectionStabilitySoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("IDEM_RAFT_SOAK"))
	if err != nil {
		t.Skip("set IDEM_RAFT_SOAK=<duration> to run")
	}
	mode := os.Getenv("IDEM_RAFT_SOAK_TIMEOUTS")
	mod := func(cfg *Config) {
		switch mode {
		case "default":
			*cfg = DefaultConfig()
			cfg.NoFsync = true
		case "medium":
			cfg.HeartbeatTimeout, cfg.ElectionTimeout = 500*time.Millisecond, 500*time.Millisecond
			cfg.LeaderLeaseTimeout = 250 * time.Millisecond
		case "fast":
			cfg.HeartbeatTimeout, cfg.ElectionTimeout = 100*time.Millisecond, 100*time.Millisecond
			cfg.LeaderLeaseTimeout = 50 * time.Millisecond
		}
	}
	var shards []string
	for i := range 12 {
		shards = append(shards, fmt.Sprintf("s%d", i))
	}
	c := newTestCluster(t, 3, shards, mod)
	for _, s := range shards {
		c.leader(s)
	}
	elections := func() (n int) {
		for _, node := range c.nodes {
			for _, g := range node.host.Groups() {
				mfs, _ := node.reg.Gather()
				for _, mf := range mfs {
					if mf.GetName() != "idem_raft_leader_changes_total" {
						continue
					}
					for _, m := range mf.GetMetric() {
						if m.GetLabel()[0].GetValue() == g.ID() {
							n += int(m.GetCounter().GetValue())
						}
					}
				}
			}
		}
		return n
	}
	base := elections()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failures sync.Map
	for w := range 24 {
		wg.Go(func() {
			shard := shards[w%len(shards)]
			for seq := 0; ; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				for _, node := range c.nodes {
					g, _ := node.host.Group(shard)
					if !g.IsLeader() {
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					if _, err := g.Apply(ctx, fmt.Appendf(nil, "w%d-%d=x", w, seq)); err != nil {
						failures.Store(err.Error(), true)
					}
					cancel()
				}
			}
		})
	}
	time.Sleep(d) // the soak duration itself, not a wait for a condition
	close(stop)
	wg.Wait()
	// Each leader change is observed by 3 nodes.
	changes := float64(elections()-base) / 3
	var errs []string
	failures.Range(func(k, _ any) bool { errs = append(errs, k.(string)); return len(errs) < 5 })
	t.Logf("timeouts=%q duration=%v groups=%d leader changes after startup=%.1f (%.2f per group-minute); sample errors: %s",
		mode, d, len(shards), changes, changes/float64(len(shards))/d.Minutes(), strings.Join(errs, " | "))
}
