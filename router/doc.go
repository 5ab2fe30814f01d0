// Package router moves requests to the node that can answer them, over the
// mapping package topology computes (key -> shard -> voters):
//
//   - Forwarder sends a command for a shard to its leader over the public
//     gRPC API, with a leader cache fed by answers, a hop limit, and retries
//     only where a retry cannot apply a command twice. Storage nodes use it
//     for keys they do not lead. Concurrent calls to one node share Batch
//     RPCs (internal/rpcbatch), one batcher per node, principal and hop
//     count, so the node authorizes each operation as the principal it was
//     forwarded for.
//   - Backend is the server.Backend of the stateless edge router
//     (idemrouter): it locates each key's shard and forwards to its leader,
//     and answers UNAVAILABLE when the shard cannot be reached in time.
//   - RingCheck asks the cluster's nodes which ring they were created with,
//     so a process started with another topology file refuses to route.
//   - Process is the whole idemrouter process: the Backend, the JSON and
//     gRPC listeners, proxy mode, and the drain on shutdown.
//
// The package never imports raftstore, so routers stay free of storage code.
package router
