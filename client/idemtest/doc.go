// Package idemtest runs an in-process idem store for tests: a gRPC server on
// 127.0.0.1 that serves the real Idempotency service (package server, the
// one an idemnode serves) over backend.Mem, the real state machine (package
// fsm) in memory, with one log and no replication.
//
// It decides exactly what a one-shard idem cluster decides (same outcomes,
// fencing tokens that grow with every acquisition, same validation, limits,
// messages and error details, since it is the same code),
// and adds what tests need and a real cluster cannot offer on demand: a
// clock that tests move forward (Advance) to let leases and retention run
// out without sleeping, and fault injection per RPC: FailNext answers the
// next calls with an error before anything is applied, DropNext applies the
// next calls and then loses their answers, the way a leader change or a
// network cut loses them.
//
// It answers the Routing RPC UNIMPLEMENTED, as a router does, so a client
// stays round-robin. To test leader routing, start several servers, build a
// topology naming their addresses, and SetRouting each with
// idemv1.RoutingToProto of it; SetLeaderHint sends a leader in every
// answer's idem-leader header, as a node names the key's shard's leader.
//
//	srv, err := idemtest.Start(idemtest.Config{})
//	if err != nil { ... }
//	defer srv.Close()
//	c, err := client.New(client.DefaultConfig(srv.Addr()))
//
// It is not a store to run in production: nothing is persisted.
package idemtest
