// Command idembench is idem's load generator. Each of --concurrency workers
// loops reserve (a fresh UUIDv7 key) and complete (a --body-bytes response)
// against the JSON or gRPC API of one or more nodes or routers, and the run
// ends with cycles per second, nearest-rank p50/p90/p99/max latencies of whole
// cycles and of each step, errors by kind with the first message of each, and
// the configuration, as text or (--json) one JSON object.
//
//	idembench --target grpc --addr 127.0.0.1:7070 --concurrency 32 --duration 30s
//	idembench --target json --addr 10.0.0.1:8101,10.0.0.2:8101 --cycles 100000 --json
//
// Latencies are kept whole, in one slice per worker preallocated for the run,
// and sorted at the end: exact percentiles, no histogram error, and memory
// bounded by the run's length. A cycle still running when the duration ends
// finishes and counts, so the end of a run causes no errors. For gRPC it uses
// package client with --max-attempts 1 by default, so every failure is seen;
// raise it to measure what a retrying application experiences. For JSON,
// reserves rotate over --addr and each complete goes to the address the
// reserve's answer named in its Idem-Leader header (the key's shard's
// leader, which a node names and a router does not) when that address is
// one of --addr, so it skips the forwarding hop a follower pays.
package main
