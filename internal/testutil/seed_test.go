package testutil

import (
	"fmt"
	"strings"
	"testing"
)

// seedTB is a testing.TB whose failure state and cleanups the test drives.
type seedTB struct {
	testing.TB
	name     string
	failed   bool
	fatal    string
	logs     []string
	cleanups []func()
}

func (s *seedTB) Helper()          {}
func (s *seedTB) Name() string     { return s.name }
func (s *seedTB) Failed() bool     { return s.failed }
func (s *seedTB) Cleanup(f func()) { s.cleanups = append(s.cleanups, f) }
func (s *seedTB) Logf(format string, args ...any) {
	s.logs = append(s.logs, fmt.Sprintf(format, args...))
}
func (s *seedTB) Fatalf(format string, args ...any) { s.fatal = fmt.Sprintf(format, args...) }
func (s *seedTB) runCleanups() {
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
}

func TestSeedFromTheEnvironmentAndLoggedOnFailure(t *testing.T) {
	t.Setenv(SeedEnv, "4711")
	tb := &seedTB{name: "TestX/case_1"}
	if got := Seed(tb); got != 4711 {
		t.Fatalf("Seed with %s=4711: %d", SeedEnv, got)
	}
	tb.runCleanups()
	if len(tb.logs) != 0 {
		t.Fatalf("a passing test logged %q", tb.logs)
	}
	tb.failed = true
	tb.runCleanups()
	want := "seed 4711; replay: IDEM_SEED=4711 go test -run '^TestX$/^case_1$' ./internal/testutil"
	if len(tb.logs) != 1 || tb.logs[0] != want {
		t.Fatalf("failed test logged %q, want %q", tb.logs, want)
	}
}

func TestSeedFreshWhenUnset(t *testing.T) {
	t.Setenv(SeedEnv, "")
	seen := map[uint64]bool{}
	for range 5 {
		s := Seed(&seedTB{name: "TestX"})
		if s == 0 {
			t.Fatal("Seed returned 0")
		}
		seen[s] = true
	}
	if len(seen) < 2 {
		t.Fatalf("five fresh seeds were all %v", seen)
	}
}

func TestSeedRefusesGarbage(t *testing.T) {
	t.Setenv(SeedEnv, "twelve")
	tb := &seedTB{name: "TestX"}
	Seed(tb)
	if !strings.Contains(tb.fatal, SeedEnv) {
		t.Fatalf("IDEM_SEED=twelve: fatal %q, want one naming %s", tb.fatal, SeedEnv)
	}
}

func TestRandStreamsReplay(t *testing.T) {
	a, b := Rand(9, 1), Rand(9, 1)
	other := Rand(9, 2)
	same, differ := true, false
	for range 8 {
		x, y, z := a.Uint64(), b.Uint64(), other.Uint64()
		same = same && x == y
		differ = differ || x != z
	}
	if !same || !differ {
		t.Fatalf("same seed and stream equal: %v; other stream differs: %v", same, differ)
	}
}
