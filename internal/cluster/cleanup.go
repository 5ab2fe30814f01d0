package cluster

import (
	"sort"
	"testing"

	"github.com/idem-dev/idem/internal/launch"
)

// logTailLines is how much of each process log a failed test shows.
const logTailLines = 40

// StopOnCleanup stops every process of c (routers, then nodes) when the test
// ends, failing it if one did not drain cleanly or reported a data race, and
// shows the tail of each process's log when the test failed.
func (c *Cluster) StopOnCleanup(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		if err := c.StopAll(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
		if t.Failed() {
			c.LogTails(t)
		}
	})
}

// LogTails logs the tail of every process's log, in name order.
func (c *Cluster) LogTails(t testing.TB) {
	t.Helper()
	procs := map[string]*launch.Process{}
	for id, p := range c.Nodes {
		procs[id] = p
	}
	for name, p := range c.Routers {
		procs[name] = p
	}
	names := make([]string, 0, len(procs))
	for name := range procs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Logf("---- tail of %s log ----\n%s", name, procs[name].LogTail(logTailLines))
	}
}
