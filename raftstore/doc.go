// Package raftstore runs many hashicorp/raft groups in one process: one
// group per shard, a node hosting a replica of several shards, all of them
// sharing a single TCP port.
//
// raftstore knows nothing about idempotency records. It replicates opaque
// []byte commands into a StateMachine (package fsm adapts to it elsewhere)
// and hands each command's result back to the proposer.
//
// Usage:
//
//	cfg := raftstore.DefaultConfig()
//	cfg.NodeID, cfg.RaftListenAddr, cfg.DataDir = "n1", "10.0.0.1:7000", "/var/lib/idem"
//	cfg.Logger, cfg.Registry = logger, registry
//	host, err := raftstore.NewHost(cfg)
//	g, err := host.AddGroup(raftstore.GroupConfig{ID: "eu-0", Voters: peers}, sm)
//	res, err := g.Apply(ctx, cmd)   // on the leader; *NotLeaderError elsewhere
//	err = g.ReadBarrier(ctx)        // then read sm: linearizable
//	err = host.WaitReady(ctx)       // every group has a leader and is caught up
//	err = host.Shutdown(ctx)        // hands leadership over, then stops
//
// Guarantees:
//
//   - An Apply that returns nil error was committed by a quorum (fsync'd on
//     each, unless Config.NoFsync) and applied on the leader; it survives
//     any minority of crashes and every restart.
//   - An Apply error says whether the command was definitely not applied
//     (ErrNotLeader, ErrEnqueueTimeout, a context error before proposing) or
//     may have been (ErrUnknownOutcome).
//   - After ReadBarrier returns nil on a node, its StateMachine reflects every
//     command acknowledged anywhere before ReadBarrier was called.
//   - A group restarted on its data directory rejoins from its own state and
//     never bootstraps a second time.
//
// The groups of a host keep their logs and stable stores in one pebble
// instance (DataDir/raftlog), a key prefix per group, one synced batch per
// write, so that writes of all groups arriving together share one WAL
// fdatasync (Config.LogStore; a bolt file per group is the alternative, and
// a data dir keeps the store it was created with),
// and their snapshots in DataDir/shards/<id>/. With
// Config.Packer, commands proposed while a group's leader is storing its
// previous entry are packed into one Raft entry (the proposal buffer); each proposer still
// gets its own result and error; with Config.PackingGated only from
// Group.EnablePacking on (the caller's feature gate). See DESIGN.md for the wire format, the
// read barrier's proof sketch, the timeouts and the trade-offs.
package raftstore
