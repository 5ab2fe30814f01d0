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
