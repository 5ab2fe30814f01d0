package testutil

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeTB records Fatalf and Skip instead of stopping the goroutine, so the
// tests can check what a timeout or a missing program reports.
type fakeTB struct {
	testing.TB
	mu      sync.Mutex
	failed  string
	skipped string
	logs    []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skip(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.skipped = fmt.Sprint(args...)
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = fmt.Sprintf(format, args...)
}
func (f *fakeTB) Log(args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logs = append(f.logs, fmt.Sprint(args...))
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	Eventually(t, 10*time.Second, "the third call", func() (bool, string) {
		calls++
		return calls == 3, fmt.Sprintf("call %d", calls)
	})
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}
}

func TestEventuallyReportsWhatWasLastSeen(t *testing.T) {
	f := &fakeTB{TB: t}
	calls := 0
	Eventually(f, 30*time.Millisecond, "a leader", func() (bool, string) {
		calls++
		return false, fmt.Sprintf("no leader after %d looks", calls)
	})
	want := fmt.Sprintf("waiting for a leader; last seen: no leader after %d looks", calls)
	if calls < 2 || !strings.Contains(f.failed, want) {
		t.Fatalf("after %d calls the failure reads %q, want it to contain %q", calls, f.failed, want)
	}
}

func TestUntilFailsWithWhatItWaitedFor(t *testing.T) {
	f := &fakeTB{TB: t}
	Until(f, 10*time.Millisecond, "the moon", func() bool { return false })
	if !strings.Contains(f.failed, "waiting for the moon") {
		t.Fatalf("failure %q does not name the condition", f.failed)
	}
	f = &fakeTB{TB: t}
	Until(f, time.Second, "the sun", func() bool { return true })
	if f.failed != "" {
		t.Fatalf("a condition that holds failed: %q", f.failed)
	}
}

func TestLoggerWritesToTheTestLogUntilCleanup(t *testing.T) {
	f := &fakeTB{TB: t}
	var cleanups []func()
	log := Logger(cleanupTB{f, &cleanups}, slog.LevelInfo)
	log.Debug("hidden")
	log.Info("shown", "shard", "r1-0")
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	log.Info("after the test")
	if len(f.logs) != 1 || !strings.Contains(f.logs[0], "msg=shown shard=r1-0") {
		t.Fatalf("logs %q, want only the info record before cleanup", f.logs)
	}
}

type cleanupTB struct {
	*fakeTB
	cleanups *[]func()
}

func (c cleanupTB) Cleanup(fn func()) { *c.cleanups = append(*c.cleanups, fn) }
