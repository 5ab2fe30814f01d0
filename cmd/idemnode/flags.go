package main

import (
	"github.com/idem-dev/idem/internal/flagdoc"
)

// Sections of idemnode's --help, in order.
const (
	secCluster  = "Cluster"
	secSecurity = "Security"
	secLimits   = "Limits"
	secTime     = "Time"
	secRaft     = "Raft"
	secProcess  = "Process"
	secTracing  = "Tracing"
)

// flagTable is idemnode's flags: each sets a field of o, most of them of
// o.cfg (the node's Config), whose value when the table is built is the
// flag's default.
func flagTable(o *options) flagdoc.Table {
	const testingOnly = "TESTING ONLY (needs " + faultInjectionEnv + "=1): "
	flags := []flagdoc.Flag{
		{Name: "dev", Value: &o.dev, Section: secCluster, Usage: "run a one-node, one-region cluster that bootstraps itself; needs no config file"},
		{Name: "config", Value: &o.config, Section: secCluster, Usage: "cluster topology `FILE` (YAML or JSON); required unless --dev"},
		{Name: "id", Value: &o.id, Section: secCluster, Usage: "this node's `ID` in the topology; required with --config"},
		{Name: "data-dir", Value: &o.dataDir, Section: secCluster, Usage: "`DIR` for Raft logs, snapshots and state, created if missing (default ./idem-data/<id>, dev: ./idem-data/dev)"},
		{Name: "http-addr", Value: &o.httpAddr, Section: secCluster, Usage: "`HOST:PORT` for the JSON API, /metrics, /healthz, /readyz (dev default 127.0.0.1:8080; else the topology's; with --config only where this process listens)"},
		{Name: "grpc-addr", Value: &o.grpcAddr, Section: secCluster, Usage: "`HOST:PORT` for the gRPC API (dev default 127.0.0.1:7070; else the topology's)"},
		{Name: "raft-addr", Value: &o.raftAddr, Section: secCluster, Usage: "`HOST:PORT` for Raft traffic of all shards of this node (dev default 127.0.0.1:7000; else the topology's)"},

		{Name: "max-response-bytes", Value: &o.cfg.MaxResponseBytes, Section: secLimits, Usage: "largest stored response body in decoded `BYTES`"},
		{Name: "state-cache-bytes", Value: &o.cfg.StateCacheBytes, Section: secLimits, Usage: "the state engine's block cache in `BYTES`, memtables included: most of the node's resident memory, which it bounds whatever the retained state; at least 64 MiB"},
		{Name: "max-state-bytes", Value: &o.cfg.MaxStateBytes, Section: secLimits, Usage: "stored state in `BYTES` at which requests that add data (a reserve of a new key, a complete) get 429 RESOURCE_EXHAUSTED until sweeps free space (0: 80% of the data dir's free space at start)"},
		{Name: "disk-reserve-bytes", Value: &o.cfg.DiskReserveBytes, Section: secLimits, Usage: "free `BYTES` kept on the data dir's filesystem: below it, writes that add data (a reserve of a new key, a complete) get 429 and resume by themselves when space returns (0: 5% of the filesystem, at most 1 GiB)"},
		{Name: "max-waiters", Value: &o.cfg.MaxWaiters, Section: secLimits, Usage: "most reserves with a wait (wait_ms) this node serves at once, waiting or forwarded; past it a reserve is answered at once, as with wait_ms 0 (idem_node_wait_refusals_total)"},
		{Name: "max-inflight-bytes", Value: &o.cfg.MaxInflightBytes, Section: secLimits, Usage: "request `BYTES` (JSON bodies, gRPC messages) this node holds at once in requests not yet answered; past it, while others are in flight, a request gets 503 UNAVAILABLE with Retry-After (idem_api_inflight_request_bytes)"},
		{Name: "gc-headroom-bytes", Value: &o.gcHeadroom, Section: secLimits, Usage: "let the Go heap grow by at least `BYTES` past what the last garbage collection found live before the next (the node collects at GOGC=50, or later while 50% of the live heap is less than this); 0: GOGC=50 alone. GOGC in the environment replaces both"},

		{Name: "clock-skew-margin", Value: &o.cfg.ClockSkewMargin, Section: secTime, Usage: "how long past a lease's end before another caller may reclaim the key"},
		{Name: "max-clock-offset", Value: &o.cfg.MaxClockOffset, Section: secTime, Usage: "largest offset `D` of this node's clock from its peers' (measured on node-to-node gRPC): past it the node leads no shard and is not ready; 0 turns that check off (an unsafe setting, warned of; commands are still stamped with a majority's clock, within 500ms); not used in --dev"},

		{Name: "raft-snapshot-threshold", Aliases: []string{"snapshot-threshold"}, Value: &o.cfg.Raft.SnapshotThreshold, Section: secRaft, Usage: "take a Raft snapshot of a shard after this many new log `ENTRIES`"},
		{Name: "raft-snapshot-interval", Aliases: []string{"snapshot-interval"}, Value: &o.cfg.Raft.SnapshotInterval, Section: secRaft, Usage: "how often each shard checks whether to snapshot (a snapshot is a reference to the state on disk and costs one sync)"},
		{Name: "raft-trailing-logs", Aliases: []string{"trailing-logs"}, Value: &o.cfg.Raft.TrailingLogs, Section: secRaft, Usage: "log `ENTRIES` kept behind a snapshot for slow followers"},
		{Name: "raft-max-conns", Aliases: []string{"max-raft-conns"}, Value: &o.cfg.Raft.MaxInboundConns, Section: secRaft, Usage: "cap on the inbound Raft connections open at once; past it new ones are closed and counted"},
		{Name: "raft-log-store", Value: &o.cfg.Raft.LogStore, Section: secRaft, Usage: "where the shards keep their Raft logs: `STORE` pebble (one pebble instance per node, DATA_DIR/raft/raftlog) or bolt (a bbolt file per shard); a data dir keeps the store it was created with"},
		{Name: "raft-pack-commands", Value: &o.cfg.PackCommands, Section: secRaft, Usage: "=auto, =on or =off (with the =): pack commands proposed while a shard's leader stores its previous Raft entry into one entry (faster under load). auto packs once the cluster version reaches 2 (every node runs a release that reads packed entries); on always packs (every node must run a release that has this flag; a bare --raft-pack-commands means on, =true and =false mean on and off); off never packs and advertises cluster version 1, which holds the cluster version (and with it packing and partition handoff) at 1 while this node is in the cluster"},

		{Name: "log-level", Value: &o.logLevel, Section: secProcess, Usage: "log `LEVEL`: debug, info, warn or error"},
		{Name: "log-format", Value: &o.logFormat, Section: secProcess, Usage: "log `FORMAT`: text or json"},
		{Name: "pprof-addr", Value: &o.pprofAddr, Section: secProcess, Usage: "serve Go's profiles (/debug/pprof/) on this loopback `HOST:PORT`, e.g. 127.0.0.1:6060 (default: off)"},
		{Name: "version", Value: &o.showVersion, Section: secProcess, Usage: "print the version and exit"},

		{Name: "testing-clock-offset", Value: &o.cfg.Testing.ClockOffset, Section: flagdoc.Testing, Usage: testingOnly + "shift this node's clock by `D` (fault injection for clock-skew scenarios)"},
		{Name: "testing-fail-log-commits-after", Value: &o.cfg.Testing.FailLogCommitsAfter, Section: flagdoc.Testing, Usage: testingOnly + "make every Raft log commit after the first `N` fail as a failed fsync would"},
		{Name: "testing-fail-drops", Value: &o.cfg.Testing.FailDrops, Section: flagdoc.Testing, Usage: testingOnly + "fail the first `N` commands this node sends, driving a topology change, to drop a source's copy of moved partitions"},
		{Name: "testing-crash-during-restore", Value: &o.testCrashRestore, Section: flagdoc.Testing, Usage: testingOnly + "exit at once with status 86, no cleanup (a crash), when a snapshot restore has written `N` records into the new state generation, before it switches to it"},
	}
	flags = append(flags, o.sec.FlagTable(secSecurity)...)
	flags = append(flags, o.trace.FlagTable(secTracing)...)
	return flagdoc.Table{
		Command:  "idemnode",
		Sections: []string{secCluster, secSecurity, secLimits, secTime, secRaft, secProcess, secTracing, flagdoc.Testing},
		Flags:    flags,
	}
}
