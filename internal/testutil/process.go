package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// NeedsProcesses marks tb as process-level: it starts real processes
// (idemnode, idemrouter, idemctl, a client suite, a container) and so does
// not run in the fast inner loop. Under -short it skips tb, saying so; the
// full suite (README: go test -race -count=1 -timeout 40m ./...) runs it.
// Call it first, before anything is built or started.
func NeedsProcesses(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("process-level test (starts real processes): skipped with -short; the full suite runs it")
	}
}

// NeedsCommand marks tb as needing the program name on PATH (install: how
// to get it, e.g. "apt-get install curl"). Without it tb skips, saying so,
// except under CI (CI=true), where .ci/run installs what the tests need and a
// missing program fails tb instead of letting it pass unrun.
func NeedsCommand(tb testing.TB, name, install string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err == nil {
		return
	}
	Missing(tb, name+" is not installed ("+install+")")
}

// Missing reports that something tb needs beyond Go (a program, a library,
// a language's package; what says which and how to get it) is absent: tb
// skips, saying so, except under CI (CI=true), where .ci/run installs what
// the tests need and a skip would let tb pass unrun, so tb fails instead.
func Missing(tb testing.TB, what string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s; .ci/run installs it", what)
		return
	}
	tb.Skip(what)
}
