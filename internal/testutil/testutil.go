// Package testutil holds what idem's tests share: polling a condition with a
// deadline, loggers that write to the test's log, and test certificates. It
// is imported by _test.go files only.
//
// Tests never sleep to wait for a condition; they poll it:
//
//	testutil.Eventually(t, 10*time.Second, "a leader for every shard", func() (bool, string) {
//		missing := leaderless()
//		return len(missing) == 0, fmt.Sprintf("no leader yet: %v", missing)
//	})
//
// and on timeout the failure says what was last seen, not only that time ran
// out.
package testutil

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// Poll intervals of Eventually: the first check is immediate, then the wait
// doubles from minPoll up to maxPoll, so a condition that holds soon is seen
// soon and a slow one does not spin.
const (
	minPoll = time.Millisecond
	maxPoll = 20 * time.Millisecond
)

// Eventually calls cond until it reports true, and fails the test (from the
// calling goroutine, with t.Fatalf) when timeout passes first, naming what it
// waited for and the last thing cond reported.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() (ok bool, lastSeen string)) {
	tb.Helper()
	if msg, ok := poll(timeout, cond); !ok {
		tb.Fatalf("timed out after %s waiting for %s; last seen: %s", timeout, what, msg)
	}
}

// Until is Eventually for a condition with nothing to report.
func Until(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if _, ok := poll(timeout, func() (bool, string) { return cond(), "" }); !ok {
		tb.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// poll runs cond until it holds (true) or timeout passes (false, with cond's
// last report).
func poll(timeout time.Duration, cond func() (bool, string)) (string, bool) {
	deadline := time.Now().Add(timeout)
	wait := minPoll
	for {
		ok, last := cond()
		if ok {
			return last, true
		}
		if !time.Now().Before(deadline) {
			return last, false
		}
		time.Sleep(min(wait, time.Until(deadline)))
		wait = min(2*wait, maxPoll)
	}
}

// Logger returns a text slog logger at level that writes each record to
// tb.Log. Goroutines (Raft's, a server's) may log a moment after the test
// ends, when tb.Log would panic: the logger goes silent once the test's
// cleanups have run.
func Logger(tb testing.TB, level slog.Level) *slog.Logger {
	w := &tbWriter{tb: tb}
	tb.Cleanup(w.stop) // registered first, so it runs last
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type tbWriter struct {
	mu   sync.Mutex
	tb   testing.TB
	done bool
}

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.tb.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *tbWriter) stop() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}
