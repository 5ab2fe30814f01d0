package idemv1

import (
	"context"
	"strconv"

	"google.golang.org/grpc/metadata"
)

// gRPC metadata of forwarded requests: on the wire, the hop count and the
// leader hint travel as these headers. Inside a process they are data
// (backend.Routed's hops argument and leader result), never context values.
const (
	// HopsHeader counts how often a request was forwarded; a node that
	// receives one at MaxHops answers instead of forwarding again, so a
	// stale leader hint can never make requests circle.
	HopsHeader = "idem-hops"
	// LeaderHeader is set by a node on its answers: the node id it believes
	// leads the request's shard. Forwarders cache it.
	LeaderHeader = "idem-leader"
	// MaxHops bounds forwarding: client -> router -> any voter -> leader.
	MaxHops = 2
)

// HopsFromMetadata reads HopsHeader: 0 when absent, MaxHops when malformed
// (a malformed count must not enable loops).
func HopsFromMetadata(md metadata.MD) int { return hopsFrom(md.Get(HopsHeader)) }

// HopsFromIncomingContext is HopsFromMetadata of an incoming RPC's
// metadata, read without copying all of it.
func HopsFromIncomingContext(ctx context.Context) int {
	return hopsFrom(metadata.ValueFromIncomingContext(ctx, HopsHeader))
}

func hopsFrom(v []string) int {
	if len(v) == 0 {
		return 0
	}
	n, err := strconv.Atoi(v[0])
	if err != nil || n < 0 {
		return MaxHops
	}
	return n
}
