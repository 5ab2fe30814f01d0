// Package router moves requests to the node that can answer them, over the
// mapping package topology computes (key -> shard -> voters), with the
// forwarding of package forward:
//
//   - Backend is the server.Backend of the stateless edge router
//     (idemrouter): it locates each key's shard and forwards to its leader
//     (forward.Forwarder), checks the cluster's ring (forward.RingCheck),
//     and answers UNAVAILABLE when the shard cannot be reached in time.
//   - Process is the whole idemrouter process: the Backend, the JSON and
//     gRPC listeners, proxy mode, and the drain on shutdown.
//
// The package never imports raftstore, so routers stay free of storage code.
package router
