package handoff

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/statedb"
)

func openDB(t testing.TB) *statedb.DB {
	t.Helper()
	db, err := statedb.Open(statedb.Config{Dir: t.TempDir(), CacheBytes: 8 << 20, PartitionCount: partCount})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// report fails t with the schedule's trace when the world broke an
// invariant.
func report(t *testing.T, w *world, how string) {
	t.Helper()
	if len(w.failures) == 0 {
		return
	}
	t.Fatalf("%s broke an invariant:\n  %s\ntrace:\n  %s", how, strings.Join(w.failures, "\n  "), strings.Join(w.trace, "\n  "))
}

// TestExploreSmallScopes runs every schedule of small scopes with up to a
// bound of deviations (1 with -short, 2 by default; IDEM_EXPLORE_BOUND=3
// explores about 25 times more, some minutes a scope) from "let the running driver go on" (CHESS-style
// preemption bounding): each deviation is a switch to another actor, a
// crash of a driver at that step (it restarts with no memory), a failover
// that deposes the meta leader (it goes on with its stale view), a lost,
// delayed or duplicated handoff command, or a client's reserve or complete.
// Two drivers with different batch sizes, the disk follower of each group
// applying with its own batch cuts.
func TestExploreSmallScopes(t *testing.T) {
	scopes := []struct {
		name  string
		sc    scope
		bound int
	}{
		{"failover+crash", scope{drivers: 2, sizes: []int{1, 3}, crashes: 1, failovers: 1, steps: 60}, 2},
		{"failover+faults", scope{drivers: 2, sizes: []int{3, 1}, failovers: 1, faults: 1, steps: 60}, 2},
		{"two-failovers+client", scope{drivers: 2, sizes: []int{2, 3}, failovers: 2, clients: 2, steps: 60}, 2},
		{"crash+faults+client", scope{drivers: 1, sizes: []int{2}, crashes: 1, faults: 1, clients: 1, steps: 60}, 2},
		// The same with the disk followers (slower: a bound of 1).
		{"disk", scope{drivers: 2, sizes: []int{1, 3}, crashes: 1, failovers: 1, faults: 1, clients: 1, steps: 60, disk: true}, 1},
	}
	if testing.Short() {
		for i := range scopes {
			scopes[i].bound = 1
		}
	}
	if b, err := strconv.Atoi(os.Getenv("IDEM_EXPLORE_BOUND")); err == nil {
		for i := range scopes {
			scopes[i].bound = b
		}
	}
	db := openDB(t)
	id := 0
	for _, s := range scopes {
		t.Run(s.name, func(t *testing.T) {
			start := time.Now()
			c := &dfsChooser{bound: s.bound}
			runs, steps := 0, 0
			for {
				id++
				w := newWorld(t, s.sc, c, uint64(id), db, id)
				w.run()
				runs++
				steps += w.steps
				report(t, w, "schedule "+c.String())
				if !c.next() {
					break
				}
			}
			t.Logf("%s: %d schedules (every one with up to %d deviations), %d steps, in %s", s.name, runs, s.bound, steps, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestExploreRandomWalks walks larger scopes by seed: three drivers,
// several crashes, failovers and network faults, clients, time passing and
// the destination's clock jumping ahead of or behind the source's.
func TestExploreRandomWalks(t *testing.T) {
	seed := testutil.Seed(t)
	walks := 400
	if testing.Short() {
		walks = 100
	}
	db := openDB(t)
	start := time.Now()
	steps := 0
	for i := range walks {
		s := seed + uint64(i)
		rng := testutil.Rand(s, 1)
		sc := scope{drivers: 3, sizes: []int{1 + rng.IntN(3), 1 + rng.IntN(3), 1 + rng.IntN(3)}, crashes: rng.IntN(4), failovers: rng.IntN(4),
			faults: rng.IntN(5), clients: rng.IntN(12), ticks: rng.IntN(6), skews: rng.IntN(3), steps: 150, disk: true}
		w := newWorld(t, sc, randomChooser{rng}, s, db, i+1)
		w.run()
		steps += w.steps
		if len(w.failures) > 0 {
			t.Logf("walk seed %d (replay: IDEM_SEED=%d go test -run '^TestExploreRandomWalks$' ./handoff; the walk is number %d)", s, seed, i)
		}
		report(t, w, "walk "+strconv.FormatUint(s, 10))
	}
	t.Logf("%d walks from seed %d, %d steps, in %s", walks, seed, steps, time.Since(start).Round(time.Millisecond))
}
