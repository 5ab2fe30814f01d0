package client

import "time"

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
		if b, ok := s.(*batchStub); ok {
			b.b.mu.Lock()
			n += len(b.b.queue)
			b.b.mu.Unlock()
		}
	}
	return n
}
