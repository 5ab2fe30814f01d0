package launch

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartAgainAfterAnExitNobodyAwaited: a process that exits on its own
// (a crash) while nobody waits for it can be started again; one that runs
// cannot be started twice.
func TestStartAgainAfterAnExitNobodyAwaited(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	p := &Process{Name: "p", Bin: "/bin/sh", Log: log, Args: []string{"-c", "exit 3"}}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for p.Running() {
		if time.Now().After(deadline) {
			t.Fatal("sh -c 'exit 3' still running after 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Args = []string{"-c", "sleep 30"}
	if err := p.Start(); err != nil {
		t.Fatalf("start after the process exited on its own: %v", err)
	}
	t.Cleanup(func() { p.Kill() })
	if !p.Running() {
		t.Fatal("the restarted process is not running")
	}
	if err := p.Start(); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("a second start of a running process: %v, want already running", err)
	}
}
