package testutil

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// SeedEnv names the variable that replays a randomised test: every
// randomised test takes its seed from Seed, so IDEM_SEED=N replays any of
// them.
const SeedEnv = "IDEM_SEED"

// Seed returns the seed of a randomised test: IDEM_SEED when set, a fresh
// one (never 0) otherwise. When the test fails, it logs the seed with the
// one-line command that replays the test with it:
//
//	seed 81723; replay: IDEM_SEED=81723 go test -run '^TestRandomAgainstModel$' ./fsm
//
// Derive every random choice of the test from the seed (Rand), never from
// the time or the global generator, so the replay makes the same choices.
func Seed(tb testing.TB) uint64 {
	tb.Helper()
	seed := rand.Uint64N(1_000_000_000) + 1
	if v := os.Getenv(SeedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			tb.Fatalf("%s=%q: want an unsigned integer", SeedEnv, v)
		}
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("%s", ReplayLine(tb.Name(), seed))
		}
	})
	return seed
}

// ReplayLine is the line Seed logs when test name fails with seed.
func ReplayLine(name string, seed uint64) string {
	return "seed " + strconv.FormatUint(seed, 10) + "; replay: " + SeedEnv + "=" + strconv.FormatUint(seed, 10) +
		" go test -run '" + runPattern(name) + "' " + packageDir()
}

// Rand returns a generator for one stream (a goroutine, a phase) of a
// seeded test; streams of one seed are independent of each other.
func Rand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// runPattern is the -run pattern that selects exactly test name, a subtest
// level per slash.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// packageDir is the test's package as a go test argument ("./fsm"): go
// test runs a package's tests in its directory, so it is the working
// directory relative to the module root; "." when that cannot be told.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			rel, err := filepath.Rel(dir, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		if filepath.Dir(dir) == dir {
			return "."
		}
	}
}
