// Package regionsim shows that idem holds when the world misbehaves. Run
// starts a multi-region idem cluster as real processes on loopback (idemnode
// per node, idemrouter per region), simulates the WAN between regions with
// package wan, drives a payment workload in every region against it, injects
// the faults of each Scenario, and checks idem's invariants with package
// check; it runs the same workload against a naive SET NX PX lock (package
// naive) for comparison and returns a report.Report.
//
// # The simulated deployment
//
// Each region gets its own topology file. In it, the region's own nodes
// carry their real loopback addresses and every other region's node carries
// the address of a WAN proxy that stands for that node as seen from this
// region; the ring ignores addresses, so every view places keys and Raft
// voters identically. Nodes and routers dial what their own view says, so
// every cross-region byte (Raft, forwarding, client retries through another
// region's router) crosses a simulated link, and cuts can be per directed
// region pair. Links inside a region are direct.
//
// # The workload
//
// Clients in every region start payments (a UUIDv7 key, an amount) at a
// steady rate. Each attempt is handled by a fresh API-server instance: it
// reserves the key through a router (the local one; retries sometimes go
// through another region's), makes a fenced read of the ledger to learn what
// an earlier attempt did, charges the simulated payment provider with its
// fencing token if nothing was charged, checkpoints the charge, and records
// it (completes with the response). An attempt that RECLAIMS a key with the
// checkpoint of an earlier attempt resumes at the record step; the report
// counts these resumed attempts.
// Instances may die after reserving or after charging, pause past their
// lease, run slowly and heartbeat, or release on a transient decline;
// clients time out and retry. Every call to idem is recorded with its
// real-time interval for the linearizability check.
//
// # What it checks
//
// Exactly-once side effects (the ledger, guard on), replays identical to
// the first response, per-key linearizability against a model of the
// contract (porcupine), no acknowledged completion lost after the faults
// heal, and availability and latency per phase and region. The comparison
// rows show what the same run let through with the ledger's guard off and
// with the naive lock.
//
// # What each survival mode costs
//
// MeasureLatency starts the same simulated deployment with no faults and
// no workload, waits until every shard's leader is in its home region, and
// times reserve+complete cycles from a client in every region, through
// that region's router, on fresh keys homed in every region. The result
// (report.Latency) gives p50/p99 per (router region, key home region) and
// pooled for keys homed locally and elsewhere; run it once per survival
// mode to compare a local commit with a cross-region quorum.
//
// Determinism: the fault schedule and the workload's choices derive from
// Config.Seed, so a seed replays the same plan; which node leads a shard at
// a given moment, and the exact interleaving of calls, still vary from run
// to run.
package regionsim
