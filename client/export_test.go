package client

import (
	"context"
	"time"

	"github.com/idem-dev/idem/internal/rpcbatch"
)

// SetLeaderCooldown sets how long a node that failed a routed attempt gets
// no first attempt, for the tests of package client_test; it returns the
// previous value. Set it before New, never while a client runs.
func SetLeaderCooldown(d time.Duration) time.Duration {
	old := leaderCooldown
	leaderCooldown = d
	return old
}

// QueuedCalls is how many calls wait in the client's batchers' queues, for
// the tests of package client_test.
func (c *Client) QueuedCalls() int {
	n := 0
	for _, s := range c.stubs {
		if b, ok := s.(*rpcbatch.Stub); ok {
			n += b.Pick(context.Background()).Queued()
		}
	}
	return n
}
