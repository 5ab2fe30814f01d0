package raftstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

func TestClusterReplicatesAndRedirects(t *testing.T) {
	t.Parallel() // independent clusters on their own ports and dirs; mostly waiting for elections
	shards := []string{"s0", "s1", "s2"}
	c := newTestCluster(t, 3, shards, nil)
	all := c.upNodes()

	for _, shard := range shards {
		want := map[string]string{}
		var lastIndex uint64
		for k := range 20 {
			key, val := fmt.Sprintf("%s-k%d", shard, k), fmt.Sprintf("v%d", k)
			r := c.put(shard, key, val)
			if r.Key != key || r.Index <= lastIndex {
				t.Fatalf("Apply result %+v for %s after index %d: want key %s and a higher index", r, key, lastIndex, key)
			}
			lastIndex = r.Index
			want[key] = val
		}
		c.waitReplicated(shard, want, all)

		// A follower refuses, naming the leader. (Retried in case leadership
		// moves between looking it up and asking the follower.)
		var nle *NotLeaderError
		redirected := false
		for attempt := 0; attempt < 5 && !redirected; attempt++ {
			li := c.leader(shard)
			fi := (li + 1) % 3
			_, err := c.group(fi, shard).Apply(t.Context(), []byte("x=y"))
			if !errors.As(err, &nle) || !errors.Is(err, ErrNotLeader) {
				t.Fatalf("Apply on follower: got %v, want *NotLeaderError", err)
			}
			if nle.Shard != shard {
				t.Fatalf("NotLeaderError %+v names the wrong shard", nle)
			}
			redirected = nle.LeaderID == c.nodes[li].id && nle.LeaderAddr == c.nodes[li].addr
			if err := c.group(fi, shard).ReadBarrier(t.Context()); !errors.As(err, &nle) {
				t.Fatalf("ReadBarrier on follower: got %v, want *NotLeaderError", err)
			}
		}
		if !redirected {
			t.Fatalf("NotLeaderError never named the current leader; last %+v", nle)
		}
		for _, n := range c.nodes {
			if _, ok := n.sms[shard].get("x"); ok {
				t.Fatalf("a command refused by a follower was applied on %s", n.id)
			}
		}
		li := c.barrier(shard, all)
		if miss := c.nodes[li].sms[shard].missing(want); len(miss) > 0 {
			t.Fatalf("leader misses %v after ReadBarrier", miss)
		}

		s := c.group(li, shard).Stats()
		if s.State != "Leader" || s.LeaderID != c.nodes[li].id || s.Term == 0 ||
			s.AppliedIndex < lastIndex || s.CommitIndex < s.AppliedIndex || s.LastLogIndex < s.CommitIndex ||
			s.AppliedCommands < 20 || s.LogEntries < 20 || s.LogCommits == 0 {
			t.Fatalf("leader stats %+v inconsistent with 20 applied commands up to index %d", s, lastIndex)
		}
		// A follower learns of commits a little later than the leader.
		var fs GroupStats
		deadline := time.Now().Add(10 * time.Second)
		for {
			fs = c.group((li+1)%3, shard).Stats()
			if fs.State == "Follower" && !fs.LastContact.IsZero() && fs.AppliedIndex >= lastIndex {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("follower stats %+v", fs)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	for _, n := range c.nodes {
		if err := n.host.WaitReady(ctxTimeout(t, 10*time.Second)); err != nil {
			t.Fatalf("%s not ready: %v", n.id, err)
		}
		if got := len(n.host.Groups()); got != len(shards) {
			t.Fatalf("%s hosts %d groups, want %d", n.id, got, len(shards))
		}
	}

	// Metrics: every shard is exported with its own label.
	li := c.leader("s0")
	mfs, err := c.nodes[li].reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	for _, name := range []string{"idem_raft_state", "idem_raft_term", "idem_raft_commit_index",
		"idem_raft_applied_index", "idem_raft_last_log_index", "idem_raft_leader"} {
		mf := byName[name]
		if mf == nil || len(mf.GetMetric()) != len(shards) {
			t.Fatalf("metric %s: got %v, want one series per shard", name, mf)
		}
	}
	shardValue := func(name, shard string) float64 {
		for _, m := range byName[name].GetMetric() {
			if m.GetLabel()[0].GetValue() == shard {
				if h := m.GetHistogram(); h != nil {
					return float64(h.GetSampleCount())
				}
				if cn := m.GetCounter(); cn != nil {
					return cn.GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("metric %s has no series for %s", name, shard)
		return 0
	}
	if v := shardValue("idem_raft_leader", "s0"); v != 1 && c.group(li, "s0").IsLeader() {
		t.Fatalf("idem_raft_leader{shard=s0} = %v on the leader", v)
	}
	var applySamples float64
	for _, n := range c.nodes {
		mfs, err := n.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "idem_raft_apply_duration_seconds" {
				for _, m := range mf.GetMetric() {
					applySamples += float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	if applySamples < 60 {
		t.Fatalf("apply latency histograms hold %v samples, want >= 60 (20 per shard)", applySamples)
	}
	if v := shardValue("idem_raft_apply_batch_commands", "s0"); v < 1 {
		t.Fatalf("batch size histogram empty")
	}
	if v := shardValue("idem_raft_leader_changes_total", "s0"); v < 1 {
		t.Fatalf("leader changes = %v, want >= 1", v)
	}
}

func TestLeaderCrashLosesNothingAcknowledged(t *testing.T) {
	t.Parallel() // independent clusters on their own ports and dirs; mostly waiting for elections
	for _, store := range LogStores {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			testLeaderCrashLosesNothingAcknowledged(t, store)
		})
	}
}

func testLeaderCrashLosesNothingAcknowledged(t *testing.T, store string) {
	shards := []string{"s0", "s1"}
	c := newTestCluster(t, 3, shards, func(cfg *Config) { cfg.LogStore = store })
	old := c.leader("s0")

	// A writer keeps proposing to s0 through whoever leads it while the
	// leader crashes; only acknowledged writes must survive.
	var mu sync.Mutex
	acked := map[string]string{}
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		target := old
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("w%d", seq)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := c.group(target, "s0").Apply(ctx, []byte(key+"=v"))
			cancel()
			var nle *NotLeaderError
			switch {
			case err == nil:
				mu.Lock()
				acked[key] = "v"
				mu.Unlock()
			case errors.As(err, &nle) && nle.LeaderID != "":
				target = c.index(nle.LeaderID)
			case errors.Is(err, ErrNotLeader), errors.Is(err, ErrUnknownOutcome),
				errors.Is(err, ErrShutdown), errors.Is(err, context.DeadlineExceeded):
				target = (target + 1) % 3
			default:
				t.Errorf("writer: unexpected error %v", err)
				return
			}
		}
	}()

	// Let some writes through, crash the leader, and wait for a new one.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 30 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d writes acknowledged before the crash", n)
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	c.crash(old)
	survivors := c.upNodes()
	newLeader := c.leaderAmong("s0", survivors, 15*time.Second)
	if newLeader == old {
		t.Fatalf("crashed node still leads")
	}
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	deadline = time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= before+20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes did not resume after failover: %d acknowledged, %d before", n, before)
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	close(stop)
	<-writerDone

	mu.Lock()
	defer mu.Unlock()
	newLeader = c.barrier("s0", survivors)
	if miss := c.nodes[newLeader].sms["s0"].missing(acked); len(miss) > 0 {
		t.Fatalf("new leader lost %d of %d acknowledged writes, e.g. %v", len(miss), len(acked), miss[0])
	}
	c.waitReplicated("s0", acked, survivors)

	// The other shard keeps working whether or not it lost its leader.
	c.put("s1", "after", "crash")
	c.waitReplicated("s1", map[string]string{"after": "crash"}, survivors)

	// The crashed node comes back on its data dir, rejoins without
	// bootstrapping and catches up.
	c.restart(old)
	c.waitReplicated("s0", acked, c.upNodes())
	if err := c.nodes[old].host.WaitReady(ctxTimeout(t, 15*time.Second)); err != nil {
		t.Fatalf("restarted node not ready: %v", err)
	}
}

func TestRestartRestoresState(t *testing.T) {
	t.Parallel() // independent clusters on their own ports and dirs; mostly waiting for elections
	for _, tc := range []struct {
		name     string
		snapshot bool
		store    string // Config.LogStore
	}{
		{"pebble/log", false, LogStorePebble},
		{"pebble/snapshot+tail", true, LogStorePebble},
		{"bolt/log", false, LogStoreBolt},
		{"bolt/snapshot+tail", true, LogStoreBolt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shards := []string{"s0", "s1"}
			// In the snapshot case, automatic snapshots fire every few entries
			// during the bulk phase; the threshold is then raised so the
			// tail written afterwards stays in the log.
			lowThreshold := tc.snapshot
			c := newTestCluster(t, 3, shards, func(cfg *Config) {
				cfg.LogStore = tc.store
				if tc.snapshot {
					cfg.SnapshotInterval = 50 * time.Millisecond
					cfg.TrailingLogs = 2
					cfg.SnapshotThreshold = 1 << 20
					if lowThreshold {
						cfg.SnapshotThreshold = 8
					}
				}
			})
			want := map[string]map[string]string{}
			for _, shard := range shards {
				want[shard] = map[string]string{}
				for k := range 40 {
					key := fmt.Sprintf("%s-a%d", shard, k)
					c.put(shard, key, "1")
					want[shard][key] = "1"
				}
				c.waitReplicated(shard, want[shard], c.upNodes())
			}
			if tc.snapshot {
				deadline := time.Now().Add(10 * time.Second)
				for i := range c.nodes {
					for _, shard := range shards {
						g := c.group(i, shard)
						for {
							metas, err := g.snaps.List()
							if err != nil {
								t.Fatal(err)
							}
							if len(metas) > 0 {
								break
							}
							if time.Now().After(deadline) {
								t.Fatalf("no automatic snapshot on %s/%s", c.nodes[i].id, shard)
							}
							time.Sleep(10 * time.Millisecond) // polling interval
						}
						rc := g.raft.ReloadableConfig()
						rc.SnapshotThreshold = 1 << 20
						if err := g.raft.ReloadConfig(rc); err != nil {
							t.Fatal(err)
						}
						idx, term, err := g.Snapshot()
						if err != nil || idx == 0 || term == 0 {
							t.Fatalf("Snapshot on %s/%s: %d %d %v", c.nodes[i].id, shard, idx, term, err)
						}
					}
				}
				lowThreshold = false
			}
			// A tail of entries after the snapshot, overwriting some keys.
			for _, shard := range shards {
				for k := range 10 {
					key := fmt.Sprintf("%s-a%d", shard, k)
					c.put(shard, key, "2")
					want[shard][key] = "2"
				}
				c.waitReplicated(shard, want[shard], c.upNodes())
			}

			for i := range c.nodes {
				if err := c.nodes[i].host.Shutdown(ctxTimeout(t, 10*time.Second)); err != nil {
					t.Fatalf("Shutdown %s: %v", c.nodes[i].id, err)
				}
				c.nodes[i].up = false
			}
			for i := range c.nodes {
				c.restart(i)
			}
			for _, shard := range shards {
				li := c.barrier(shard, c.upNodes())
				if miss := c.nodes[li].sms[shard].missing(want[shard]); len(miss) > 0 {
					t.Fatalf("leader of %s lost %v after restart", shard, miss)
				}
				c.waitReplicated(shard, want[shard], c.upNodes())
				for i, n := range c.nodes {
					if got := c.group(i, shard).Stats().LogStore; got != tc.store {
						t.Fatalf("%s/%s: LogStore = %q, want %q", n.id, shard, got, tc.store)
					}
					applies, restores := n.sms[shard].counts()
					if tc.snapshot {
						// State came from the snapshot plus the replayed tail
						// of (at least) 10 commands.
						if restores < 1 || applies < 10 || applies >= 50 {
							t.Fatalf("%s/%s: %d restores, %d applies; want a restore and a 10-command tail", n.id, shard, restores, applies)
						}
					} else if restores != 0 || applies < 50 {
						t.Fatalf("%s/%s: %d restores, %d applies; want a full log replay", n.id, shard, restores, applies)
					}
				}
			}
			// The restarted cluster takes writes.
			c.put("s0", "post-restart", "ok")
			for _, n := range c.nodes {
				if err := n.host.WaitReady(ctxTimeout(t, 10*time.Second)); err != nil {
					t.Fatalf("%s not ready after restart: %v", n.id, err)
				}
			}
		})
	}
}

func TestReadBarrierFailsOnPartitionedLeader(t *testing.T) {
	t.Parallel() // independent clusters on their own ports and dirs; mostly waiting for elections
	c := newTestCluster(t, 3, []string{"s0"}, nil)
	old := c.leader("s0")
	c.put("s0", "k", "v1")
	c.waitReplicated("s0", map[string]string{"k": "v1"}, c.upNodes())

	c.nodes[old].host.setIsolated(true)
	// The old leader may still believe it leads; a read barrier started now
	// must not succeed, because the majority is about to accept a newer write.
	barrier := make(chan error, 1)
	stillLeader := c.group(old, "s0").IsLeader()
	go func() { barrier <- c.group(old, "s0").ReadBarrier(context.Background()) }()
	t.Logf("isolated leader still believed it led when the read barrier started: %v", stillLeader)

	var majority []int
	for _, i := range c.upNodes() {
		if i != old {
			majority = append(majority, i)
		}
	}
	nl := c.leaderAmong("s0", majority, 15*time.Second)
	// Write through the majority (the isolated node cannot be reached, so
	// put's leader lookup only considers the majority).
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.group(nl, "s0").Apply(ctx, []byte("k=v2"))
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrUnknownOutcome) {
			t.Fatalf("write on the majority side: %v", err)
		}
		nl = c.leaderAmong("s0", majority, 15*time.Second)
	}

	select {
	case err := <-barrier:
		if err == nil {
			t.Fatalf("ReadBarrier on the partitioned leader succeeded; a read would return stale k=v1")
		}
		if !errors.Is(err, ErrNotLeader) {
			t.Fatalf("ReadBarrier on the partitioned leader: %v, want ErrNotLeader", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("ReadBarrier on the partitioned leader did not return")
	}
	if v, _ := c.nodes[old].sms["s0"].get("k"); v != "v1" {
		t.Fatalf("isolated node has k=%q; the test needs it stale", v)
	}
	nl = c.barrier("s0", majority)
	if v, _ := c.nodes[nl].sms["s0"].get("k"); v != "v2" {
		t.Fatalf("new leader reads k=%q after ReadBarrier, want v2", v)
	}

	// Healed, the old leader follows and redirects to the new one.
	c.nodes[old].host.setIsolated(false)
	c.waitReplicated("s0", map[string]string{"k": "v2"}, c.upNodes())
	nl = c.leader("s0")
	if nl == old {
		return // it may win a later election; then it must serve fresh reads
	}
	var nle *NotLeaderError
	if err := c.group(old, "s0").ReadBarrier(t.Context()); !errors.As(err, &nle) || nle.LeaderID != c.nodes[nl].id {
		t.Fatalf("ReadBarrier on the old leader after healing: %v, want NotLeaderError naming %s", err, c.nodes[nl].id)
	}
}

func TestShutdownHandsOverLeadership(t *testing.T) {
	t.Parallel() // independent clusters on their own ports and dirs; mostly waiting for elections
	shards := []string{"s0", "s1", "s2"}
	c := newTestCluster(t, 3, shards, nil)
	for _, shard := range shards {
		c.put(shard, "before", "shutdown")
	}
	var nle *NotLeaderError
	li := c.leader("s0")
	if err := c.group((li+1)%3, "s0").TransferLeadership(""); !errors.As(err, &nle) {
		t.Fatalf("TransferLeadership on a follower: %v, want NotLeaderError", err)
	}
	if err := c.group(li, "s0").TransferLeadership("nobody"); !errors.Is(err, ErrUnknownPeer) && !errors.Is(err, ErrNotLeader) {
		t.Fatalf("TransferLeadership to a non-voter: %v, want ErrUnknownPeer", err)
	}

	// Make a timeout-driven election on node1 and node2 impossible within
	// the test: once node0 leads everything, only a hand-over can give the
	// shards new leaders quickly.
	for _, i := range []int{1, 2} {
		for _, shard := range shards {
			r := c.group(i, shard).raft
			rc := r.ReloadableConfig()
			rc.HeartbeatTimeout, rc.ElectionTimeout = time.Minute, time.Minute
			if err := r.ReloadConfig(rc); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Gather every shard's leadership on node0 (exercising targeted
	// transfer; retried if leadership moves meanwhile).
	deadline := time.Now().Add(20 * time.Second)
	for {
		all := true
		for _, shard := range shards {
			li := c.leader(shard)
			if li == 0 {
				continue
			}
			all = false
			if err := c.group(li, shard).TransferLeadership("node0"); err != nil && !errors.Is(err, ErrNotLeader) {
				t.Logf("TransferLeadership(%s -> node0): %v", shard, err)
			}
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("could not gather leadership on node0")
		}
	}
	handOversBefore := c.nodes[0].host.handOvers.Load()
	start := time.Now()
	if err := c.nodes[0].host.Shutdown(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	c.nodes[0].up = false
	for _, shard := range shards {
		li := c.leaderAmong(shard, []int{1, 2}, 10*time.Second)
		g := c.group(li, shard)
		if err := g.ReadBarrier(t.Context()); err != nil {
			t.Fatalf("ReadBarrier on %s's new leader: %v", shard, err)
		}
		if v, _ := c.nodes[li].sms[shard].get("before"); v != "shutdown" {
			t.Fatalf("%s lost an acknowledged write over the hand-over", shard)
		}
		if _, err := g.Apply(t.Context(), []byte("after=shutdown")); err != nil {
			t.Fatalf("write after hand-over: %v", err)
		}
	}
	t.Logf("shutdown with hand-over of %d shards took %v until all had new leaders", len(shards), time.Since(start))
	if got := c.nodes[0].host.handOvers.Load() - handOversBefore; got != uint64(len(shards)) {
		t.Fatalf("%d hand-overs on shutdown, want %d", got, len(shards))
	}
	if _, err := c.nodes[0].host.AddGroup(GroupConfig{ID: "s9", Voters: c.voters()}, newKV()); !errors.Is(err, ErrShutdown) {
		t.Fatalf("AddGroup after Shutdown: %v, want ErrShutdown", err)
	}
}

func TestApplyErrors(t *testing.T) {
	t.Parallel() // independent clusters on their own ports and dirs; mostly waiting for elections
	c := newTestCluster(t, 3, []string{"s0"}, nil)
	li := c.leader("s0")
	g := c.group(li, "s0")

	// A context that already ended: never proposed.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Apply(ctx, []byte("a=1")); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("Apply with a canceled context: %v, want context.Canceled without ErrUnknownOutcome", err)
	}

	// A leader cut off from its followers cannot commit: the proposal ends
	// with an ambiguous outcome (deadline or lost leadership), or is refused
	// if the leader already stepped down. Never success.
	c.nodes[li].host.setIsolated(true)
	_, err := g.Apply(ctxTimeout(t, 100*time.Millisecond), []byte("b=1"))
	switch {
	case err == nil:
		t.Fatalf("Apply on an isolated leader succeeded")
	case errors.Is(err, ErrUnknownOutcome), errors.Is(err, ErrNotLeader):
	default:
		t.Fatalf("Apply on an isolated leader: %v, want ErrUnknownOutcome or ErrNotLeader", err)
	}
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("deadline after proposing must be ErrUnknownOutcome: %v", err)
	}
	c.nodes[li].host.setIsolated(false)

	// After Close: ErrShutdown.
	c.crash(li)
	if _, err := g.Apply(t.Context(), []byte("c=1")); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Apply after Close: %v, want ErrShutdown", err)
	}
	if err := g.ReadBarrier(t.Context()); !errors.Is(err, ErrShutdown) {
		t.Fatalf("ReadBarrier after Close: %v, want ErrShutdown", err)
	}
}
