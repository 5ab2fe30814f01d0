package testutil

import "testing"

// NeedsProcesses marks tb as process-level: it starts real processes
// (idemnode, idemrouter, idemctl, a client suite, a container) and so does
// not run in the fast inner loop. Under -short it skips tb, saying so; the
// full suite (README: go test -race -count=1 -timeout 25m ./...) runs it.
// Call it first, before anything is built or started.
func NeedsProcesses(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("process-level test (starts real processes): skipped with -short; the full suite runs it")
	}
}
