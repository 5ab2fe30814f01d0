// Command peers measures idem against the stores teams build idempotency on
// today, on this machine and in one run. The replicated peers, a region's
// counterparts: Redis primary + two replicas (redis3-wait: AOF appendfsync
// always on all three, each Lua script followed by WAIT 2 on the same
// connection), PostgreSQL primary + one synchronous standby
// (postgres2-sync: pg_basebackup, synchronous_standby_names,
// synchronous_commit on), etcd (three members, create-if-absent and
// compare-and-swap transactions), and a three-node Raft KV on
// github.com/lni/dragonboat/v4 (dragonboat3: four groups with their leaders
// spread, idem's default shape; dragonboat3s1: one group), the "how close to
// a tuned multi-group engine" row: dragonboat steps every group of a node
// together (one log write and sync for every ready group, one connection per
// peer), which hashicorp/raft does not. Its members are this binary run as
// `peers dragonboat-node`, each with dragonboat's default log store (fsync on)
// and an in-memory map as the state machine; its client sends each key to
// its group's leader over a framed TCP protocol with many requests in flight
// per connection. The single-copy peers, the dev node's
// counterparts: Redis (AOF, appendfsync always, two Lua scripts) and
// PostgreSQL (fsync and synchronous_commit on, INSERT ... ON CONFLICT DO
// NOTHING and an owner-checked UPDATE). And a three-node idem
// region (Go client over gRPC, and the JSON API; four shards, or one: the
// idem3s1 systems) and a one-node idem dev node.
//
//	cd bench/peers && go run .                  # or: bench/peers/run.sh
//	go run . --duration 2s --rounds 1 --concurrency 64 --systems idem3-grpc,redis
//	go run . --profile-dir /tmp/prof            # plus pprof profiles of the idem3-grpc nodes
//	go run . --profile-dir /tmp/prof --profile-system idem3s1pack-grpc --systems idem3s1pack-grpc
//	go run . --timeline-dir /tmp/tl             # plus every cell's latency per 100 ms
//	go run . --idemnode /tmp/a --idemnode-b /tmp/b --systems idem3pack-grpc --rounds 6   # A/B two builds
//	go run . --systems idem3s1pack-grpc --trace-ratios 1,0.01   # the cost of tracing at two sample ratios
//
// An idem system is idem<nodes>[s<shards>][pack]-<api>: idem3 a three-node
// region, idem1 a dev node; s1 one shard per region instead of four (any
// count works for a region: idem3s3pack-grpc has three, one leader per node); pack
// runs --raft-pack-commands=on, the others =off. Before measuring a
// three-node region it waits until the nodes' leader balancing has spread
// the shards' leaders (a cell measured while leaderships move measures the
// placement), and after every idem cell it logs the Raft work per cycle,
// summed over nodes and shards from their /metrics: log writes and entries
// per write, WAL syncs, state-machine batches, commands per proposed entry.
//
// It installs the missing servers from Debian's packages (apt-get), starts
// every server as its own process on 127.0.0.1 with a data directory in a
// temporary directory, builds cmd/idemnode from this repository, and runs the
// same cycle against each: reserve a fresh key for a fresh owner id, then
// complete it with a --body-bytes response, which must be accepted. Each
// (system, client count) cell runs --warmup then --duration; cells are
// interleaved in --rounds rounds (the order of systems rotates each round),
// and the Markdown table gives the median cycles/s over rounds, the ranges
// of p50 and p99 over rounds, the servers' CPU time per cycle (user+system of
// the system's processes and their children, read from /proc), the clients'
// (this process's own, which shares the machine), and idem / peer of every
// idem row at the same client count, in two tables: against the replicated
// peers, then against the single-copy ones. --timeline-dir writes, per
// cell, the cycles that ended in each 100 ms of the window with their p50,
// p99 and max: a stall (a flush, a compaction, a GC) shows as a bucket with
// few cycles and a high p50, which the cell's p99 alone does not tell from
// latency that is high throughout. --idemnode-b BINARY runs every idem
// system twice, as SYSTEM and SYSTEM@b (the second with BINARY), in the same
// interleaved rounds, and a last table gives b / a of cycles/s and of server
// CPU per cycle paired by round: the median and range of the per-round
// ratios, which cancel most of the box's drift between rounds (runs of the
// same build minutes apart differ by up to a third on this VM).
//
// The race phase then sends --race-contenders concurrent reserves of one
// fresh key to each system, --race-keys times, and requires exactly one
// winner per key; every loser's complete must be refused and the winner's
// accepted. A violation makes the command exit 1.
//
// Semantics kept equal: every reservation carries a 30 s lease and every
// completed record a 1 h retention (Redis: PEXPIRE; PostgreSQL: columns;
// idem: its lease and retention), except etcd, where a TTL would need a lease
// grant per key (another Raft round trip), so its records do not expire.
// Every client is the system's usual Go library with one request in flight
// per worker and no retries: github.com/redis/go-redis/v9 (pool of
// max(--concurrency) connections), github.com/jackc/pgx/v5 (pgxpool of as
// many, statements prepared and cached), go.etcd.io/etcd/client/v3 (one
// client balancing over the three members), dragonboat's own client (one
// connection per member, above), idem's client package (one gRPC
// connection per node, each request sent to its shard's leader: the client's
// default routing) and net/http keep-alive for idem's JSON API, whose
// reserves go round-robin over the nodes and whose completes go to the
// node the reserve's Idem-Leader header named, the key's shard's leader
// (--json-follow-leader=false: round-robin too).
//
// Before the rounds (before any server starts) and again after them, it
// measures what this machine charges for the kernel work every store in the
// run does per operation, and prints it above the table ("Host before the
// rounds: ..."): a trivial system call, a wake-up round trip between two
// threads, a 700-byte append + fdatasync in the work directory (wall and CPU
// time), and the first touch of a fresh page. On a virtual machine these are
// many times their bare-metal cost and move from hour to hour; the stores
// compared pay them in different numbers per cycle (fsyncs, context
// switches), so the ratios of a run are to be read with them
// (docs/lab/2026-12-02-vm-kernel-costs.md).
//
// Every process runs in its own process group with a parent-death signal,
// and is stopped (SIGTERM; PostgreSQL SIGINT, its fast shutdown) at the end,
// on failure and on Ctrl-C. It is its own Go module so that its clients stay
// out of idem's go.mod; `go test ./...` at the repository root does not enter
// it: run `go test ./...` in bench/peers.
package main
