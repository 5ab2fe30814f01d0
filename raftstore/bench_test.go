package raftstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkApplyConcurrent measures replicated, fsync'd (NoFsync false)
// Apply throughput on a 3-node loopback cluster with many concurrent
// proposers, and reports how well hashicorp/raft group-commits them:
// cmds/write is log entries per leader log-store write (one bolt
// transaction of its own, or one pebble log batch), cmds/batch
// is commands per ApplyBatch call, fsyncs/s the synced log commits of all
// nodes: bolt commits (each a pair of fdatasyncs) or the pebble log's WAL
// fdatasyncs. log=pebble|bolt is Config.LogStore.
//
//	go test -run '^$' -bench ApplyConcurrent -benchtime 3s ./raftstore
//	go test -run '^$' -bench 'ApplyConcurrent/groups=8/.*/log=pebble' -benchtime 3s ./raftstore
func BenchmarkApplyConcurrent(b *testing.B) {
	for _, bc := range []struct {
		groups, proposers int
	}{
		{1, 1},
		{1, 64},
		{8, 64},
		{8, 512},
	} {
		for _, log := range LogStores {
			b.Run(fmt.Sprintf("groups=%d/proposers=%d/log=%s", bc.groups, bc.proposers, log), func(b *testing.B) {
				shards := make([]string, bc.groups)
				for i := range shards {
					shards[i] = fmt.Sprintf("s%d", i)
				}
				c := newTestCluster(b, 3, shards, func(cfg *Config) {
					*cfg = DefaultConfig() // production timeouts, fsync on
					cfg.LogStore = log
				})
				leaders := make([]*Group, len(shards))
				for i, shard := range shards {
					leaders[i] = c.group(c.leader(shard), shard)
				}
				before := make([]GroupStats, len(leaders))
				for i, g := range leaders {
					before[i] = g.Stats()
				}
				walSyncsBefore := map[string]uint64{}
				ownBefore := map[string]uint64{}
				for _, n := range c.nodes {
					walSyncsBefore[n.id] = n.host.PebbleLogStats().WALSyncs
					for _, shard := range shards {
						if g, ok := n.host.Group(shard); ok {
							ownBefore[n.id+"/"+shard] = g.Stats().LogCommits
						}
					}
				}
				var seq atomic.Uint64
				var failed atomic.Uint64
				payload := make([]byte, 100) // a typical idempotency record command
				procs := max(1, bc.proposers)
				b.ResetTimer()
				start := time.Now()
				done := make(chan struct{})
				var next atomic.Int64
				for range procs {
					go func() {
						defer func() { done <- struct{}{} }()
						for next.Add(1) <= int64(b.N) {
							n := seq.Add(1)
							g := leaders[n%uint64(len(leaders))]
							cmd := append(fmt.Appendf(nil, "k%d=", n), payload...)
							ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
							if _, err := g.Apply(ctx, cmd); err != nil {
								if failed.Add(1) == 1 {
									b.Logf("first failed apply: %v", err)
								}
							}
							cancel()
						}
					}()
				}
				for range procs {
					<-done
				}
				elapsed := time.Since(start)
				b.StopTimer()
				// A failed apply (a leader change on an overloaded box) is
				// reported, not fatal; ops/s counts acknowledged commands only.
				b.ReportMetric(float64(failed.Load()), "failed")
				var commits, entries, batches, cmds uint64
				var commitTime time.Duration
				for i, g := range leaders {
					s := g.Stats()
					commits += s.LogCommits - before[i].LogCommits
					entries += s.LogEntries - before[i].LogEntries
					batches += s.ApplyBatches - before[i].ApplyBatches
					cmds += s.AppliedCommands - before[i].AppliedCommands
					commitTime += s.LogCommitTime - before[i].LogCommitTime
				}
				b.ReportMetric(float64(uint64(b.N)-failed.Load())/elapsed.Seconds(), "ops/s")
				if commits > 0 {
					b.ReportMetric(float64(entries)/float64(commits), "cmds/write")
					b.ReportMetric(float64(commitTime.Microseconds())/float64(commits), "µs/commit")
				}
				if batches > 0 {
					b.ReportMetric(float64(cmds)/float64(batches), "cmds/batch")
				}
				// Synced commits on all nodes: the pebble logs' WAL syncs,
				// plus the own bolt files' (one per StoreLogs).
				var fsyncs uint64
				for _, n := range c.nodes {
					fsyncs += n.host.PebbleLogStats().WALSyncs - walSyncsBefore[n.id]
					for _, shard := range shards {
						if g, ok := n.host.Group(shard); ok && g.Stats().LogStore == LogStoreBolt {
							fsyncs += g.Stats().LogCommits - ownBefore[n.id+"/"+shard]
						}
					}
				}
				b.ReportMetric(float64(fsyncs)/elapsed.Seconds(), "fsyncs/s")
			})
		}
	}
}
