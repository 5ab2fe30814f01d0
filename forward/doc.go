// Package forward sends commands for a shard to the node that leads it,
// over the public gRPC API. Storage nodes (package node) use it for keys
// they do not lead, and the edge router (package router) for every key:
//
//   - Forwarder keeps a leader cache fed by answers, carries the hop count
//     (a bounded chain), and retries only where a retry cannot apply a
//     command twice; whether a failed attempt may have been applied is
//     known from the connection's state (sent or not), never from error
//     text. Concurrent calls to one node share Batch RPCs
//     (internal/rpcbatch), one batcher per node, principal and hop count,
//     so the node authorizes each operation as the principal it was
//     forwarded for.
//   - RingCheck asks the cluster's nodes which ring they were created with,
//     so a process started with another topology file refuses to route.
//   - ShardIDs lists a ring's shard ids in the ring's order.
//
// The package imports neither server nor proxy nor raftstore, so a storage
// node links no HTTP proxy engine and a router no storage code.
package forward
