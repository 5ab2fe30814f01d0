// Package node is one idem storage node (the idemnode process): the Raft
// groups of the shards it hosts with their state machines, the JSON and gRPC
// API over them, forwarding for every key it does not lead, and the
// background work that keeps the shards healthy.
//
// # Use
//
//	n, err := node.New(cfg) // validates cfg, builds the ring and API; no I/O yet
//	err = n.Run(ctx)        // Start, then Serve until ctx ends, then drain
//
// or, to learn the bound addresses first, n.Start() and later n.Serve(ctx).
// New reads neither disk nor network and starts no goroutine, so a bad
// Config fails before anything is opened. Start opens the data dir (and
// refuses one created for another cluster, node or ring: ErrDataDirMismatch),
// starts the Raft groups, binds the listeners and starts the loops. Serve
// answers until ctx ends or Close is called, then drains within 12 s
// (internal/serving's DrainTimeout): no new requests, in-flight ones
// finish, leaderships are handed over, Raft groups close.
//
// # Files
//
//   - config.go: Config, DefaultConfig, Validate.
//   - process.go: New, Start, Run, Serve and the drain; the listeners are
//     served with internal/serving, the graceful stop idemrouter shares.
//   - node.go: the Node and its server.Backend methods (Apply, Get, Ready):
//     a key this node leads is proposed to its Raft group, any other is
//     forwarded to the leader with forward.Forwarder.
//   - loops.go: the background loops, each with its own stop: the sweep of
//     expired records (leaders only), the ring check against peers, and
//     leader balancing.
//   - balance.go: the leader-balancing decision, a pure function of what the
//     node sees at each tick (who leads, the preferred voter, whether it is
//     reachable), table-tested.
//   - metrics.go: the idem_fsm_* collector; admin.go: the Admin gRPC service
//     idemctl talks to (and peers' clock probes). The data dir's identity
//     file and PrepareRejoin (replace-node) live in internal/datadir, which
//     idemctl uses without linking the node.
//   - safety.go: lost or corrupt state refused in one line (ErrStateLost),
//     fail-stop on a Raft log storage failure, the rejoin marker, the fault
//     injection warning.
//   - clock.go: the offset to each peer's clock (Admin.Clock probes), the
//     skew verdict (no leadership, not ready) and command stamping with the
//     voters' clock readings (fsm.QuorumTime).
//   - admission.go: 429 for data-adding writes below the disk reserve; the
//     admission type takes further checks (a state-size limit).
//   - mover.go, meta.go, elastic.go, topology_api.go: topology changes (the
//     meta group's state machine, seats, the mover's membership steps, the
//     topology API); handoff.go: the node's side of moving partitions, the
//     Cluster that package handoff's driver acts on (its decisions and the
//     fencing argument are in package handoff and fsm/DESIGN.md).
//   - firststart.go: the first start of a new cluster's nodes, and the
//     refusal of a data dir that lost its state.
//   - version.go: the cluster version (as etcd's): each node advertises its
//     release's on Admin.Clock, the meta group's leader raises the stored
//     cluster version to the minimum over the topology's nodes, and features
//     switch on when it reaches the version that brought them (packing with
//     --raft-pack-commands=auto, fenced partition handoff); a release below the
//     data dir's cluster version refuses to start (raftstore/DESIGN.md,
//     "Switching packing on").
//
// # Guarantees
//
// A reserve with a wait (wait_ms) waits on the node that leads the key's
// shard: a follower or a router forwards it with the wait, the leader
// registers it with the shard's backend.Waiters, which the FSM's OnApply
// wakes, and proposes it again; if the node stops leading meanwhile, the
// rest of the wait goes to the new leader. A key listing asks each shard's
// leader for its part of the page (ListShard, forwarded like any request).
//
// A node serves a key only through its shard's Raft group: reads on the
// leader after a read barrier, writes through the log, so every node gives
// the same answer for a key. Time enters commands as the voters' clock
// readings stamped by the leader, of which the FSM takes the median a
// majority agrees on (Config.Testing.ClockOffset shifts this node's own
// clock in fault tests only); the FSM never reads a clock.
//
// A data dir with an identity file held Raft state: a start that finds it
// missing refuses (ErrStateLost) unless idemctl replace-node marked the dir
// to rejoin. A failed write or fsync of the Raft log ends Serve with an
// error (the process exits non-zero); nothing after it is acknowledged.
package node
