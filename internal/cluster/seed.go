package cluster

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// SeedEnv names the variable that replays a randomised process test.
const SeedEnv = "IDEM_TEST_SEED"

// Seed returns the seed of a randomised test: IDEM_TEST_SEED when set, a
// fresh random one otherwise. It logs the seed with the one-line command
// that replays the test with it, so every run (not only a failing one) can
// be repeated.
func Seed(t testing.TB, pkg string) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if v := os.Getenv(SeedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", SeedEnv, v)
		}
	}
	t.Logf("seed %d; replay: %s=%d go test -run '^%s$' %s", seed, SeedEnv, seed, t.Name(), pkg)
	return seed
}

// Rand returns a generator for one goroutine (stream) of a seeded test.
func Rand(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }
