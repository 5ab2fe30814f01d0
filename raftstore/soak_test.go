package raftstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// maxChangesPerGroupMinute is the flapping budget the soak enforces for the
// production timeouts: DESIGN.md measured 0 leader changes after startup in
// 45 s under a CPU hog; one per group-minute allows an election caused by a
// stall of the whole box and still fails a configuration that flaps.
const maxChangesPerGroupMinute = 1.0

// TestElectionStabilitySoak checks that leaders stay put under a steady write
// load with the production timeouts: 3 nodes x 12 groups in one process, 24
// writers, counting leader changes after the initial elections. It fails when
// the groups flap (more than maxChangesPerGroupMinute) or when a write to a
// leader fails for any reason but a leader change under it. It measures the
// box as much as the code, so it runs alone, not beside the rest of the suite
// (which would starve it): .ci/run runs a 20 s soak as a step of its own, and
//
//	IDEM_RAFT_SOAK=60s IDEM_RAFT_SOAK_TIMEOUTS=default|test|medium|fast go test -race -run Soak ./raftstore
//
// runs it by hand, also with the shorter timeout sets behind DESIGN.md's table.
// Only "default" (the production timeouts, also used when the variable is
// unset) asserts the flapping budget: the others exist to measure how much
// shorter timeouts flap, so they log their count.
func TestElectionStabilitySoak(t *testing.T) {
	v := os.Getenv("IDEM_RAFT_SOAK")
	if v == "" {
		t.Skip("set IDEM_RAFT_SOAK=<duration> to run the soak (.ci/run runs it alone)")
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("IDEM_RAFT_SOAK=%q: want a positive duration such as 60s", v)
	}
	mode := os.Getenv("IDEM_RAFT_SOAK_TIMEOUTS")
	if mode == "" {
		mode = "default"
	}
	mod := func(cfg *Config) {
		switch mode {
		case "default":
			*cfg = DefaultConfig()
			cfg.NoFsync = true
		case "test": // testConfig's
		case "medium":
			cfg.HeartbeatTimeout, cfg.ElectionTimeout = 500*time.Millisecond, 500*time.Millisecond
			cfg.LeaderLeaseTimeout = 250 * time.Millisecond
		case "fast":
			cfg.HeartbeatTimeout, cfg.ElectionTimeout = 100*time.Millisecond, 100*time.Millisecond
			cfg.LeaderLeaseTimeout = 50 * time.Millisecond
		default:
			t.Fatalf("IDEM_RAFT_SOAK_TIMEOUTS=%q: want default, test, medium or fast", mode)
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
			mfs, err := node.reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() != "idem_raft_leader_changes_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					n += int(m.GetCounter().GetValue())
				}
			}
		}
		return n
	}
	base := elections()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var applied, leadershipErrs atomic.Int64
	var mu sync.Mutex
	var otherErrs []string
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
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err := g.Apply(ctx, fmt.Appendf(nil, "w%d-%d=x", w, seq))
					cancel()
					switch {
					case err == nil:
						applied.Add(1)
					case errors.Is(err, ErrNotLeader), errors.Is(err, ErrUnknownOutcome):
						// The leader changed between IsLeader and Apply, or under
						// the proposal: counted by the leader-change budget.
						leadershipErrs.Add(1)
					default:
						mu.Lock()
						otherErrs = append(otherErrs, fmt.Sprintf("shard %s on %s: %v", shard, node.id, err))
						mu.Unlock()
					}
				}
			}
		})
	}
	time.Sleep(d) // the soak duration itself, not a wait for a condition
	close(stop)
	wg.Wait()
	// Each leader change is observed by 3 nodes.
	changes := float64(elections()-base) / 3
	perGroupMinute := changes / float64(len(shards)) / d.Minutes()
	t.Logf("timeouts=%s duration=%v groups=%d writes applied=%d leader changes after startup=%.1f (%.2f per group-minute), writes lost to a leader change=%d",
		mode, d, len(shards), applied.Load(), changes, perGroupMinute, leadershipErrs.Load())
	if applied.Load() == 0 {
		t.Fatal("no write was applied during the soak: the load never ran")
	}
	if len(otherErrs) > 0 {
		t.Errorf("%d writes to a leader failed for another reason than a leader change; first: %s",
			len(otherErrs), strings.Join(otherErrs[:min(5, len(otherErrs))], " | "))
	}
	if mode == "default" && perGroupMinute > maxChangesPerGroupMinute {
		t.Errorf("leaders flapped with the production timeouts: %.1f leader changes in %v over %d groups (%.2f per group-minute, budget %.1f)",
			changes, d, len(shards), perGroupMinute, maxChangesPerGroupMinute)
	}
	if mode == "default" && changes == 0 && leadershipErrs.Load() > 0 {
		t.Errorf("%d writes failed with a leadership error although no leader changed", leadershipErrs.Load())
	}
}
