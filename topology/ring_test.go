package topology

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idem-dev/idem/internal/testutil"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json from the current code")

// testSeed returns the seed for a randomised test (IDEM_SEED replays it).
func testSeed(t *testing.T) uint64 {
	t.Helper()
	return testutil.Seed(t)
}

// randomKeys returns n distinct-looking keys from a seeded generator.
func randomKeys(seed uint64, n int) []string {
	rng := rand.New(rand.NewPCG(seed, 0x1de))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%016x-%d", rng.Uint64(), i)
	}
	return keys
}

func TestLocateMatchesLibrary(t *testing.T) {
	topo := loadTestdata(t, "three-region.yaml")
	ring := mustRing(t, topo)
	c, err := newConsistent(topo.Shards(), topo.Ring.effective())
	if err != nil {
		t.Fatal(err)
	}
	keys := randomKeys(1, 5000)
	keys = append(keys, "", strings.Repeat("k", 255), strings.Repeat("x", 400), "a:b%2F", "ünï")
	for _, ns := range []string{"default", "payments", strings.Repeat("n", 63), ""} {
		for _, key := range keys {
			want := c.LocateKey([]byte(ns + "\x00" + key)).String()
			if got := ring.Locate(ns, key).ID; got != want {
				t.Fatalf("Locate(%q, %q) = %s, library says %s", ns, key, got, want)
			}
		}
	}
}

func TestLocateSeparatesNamespaceFromKey(t *testing.T) {
	ring := mustRing(t, loadTestdata(t, "three-region.yaml"))
	// "ab"+"c" and "a"+"bc" concatenate equally; the separator keeps them
	// apart. Over many pairs at least one must land on different shards.
	differ := 0
	for i := range 200 {
		k := fmt.Sprintf("k%d", i)
		if ring.Locate("ab", k).ID != ring.Locate("a", "b"+k).ID {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("namespace and key are hashed as a plain concatenation")
	}
}

func TestRingLoadBound(t *testing.T) {
	topo := loadTestdata(t, "three-region.yaml") // 12 shards
	ring := mustRing(t, topo)
	cfg := ring.Config()
	if cfg != (RingConfig{PartitionCount: DefaultPartitionCount, ReplicationFactor: DefaultReplicationFactor, Load: DefaultLoad}) {
		t.Fatalf("Config() = %+v, want the defaults", cfg)
	}

	// Partitions: a hard bound, from the bounded-load algorithm.
	counts := ring.PartitionCounts()
	bound := int(math.Ceil(float64(cfg.PartitionCount) / 12 * cfg.Load))
	total := 0
	for id, n := range counts {
		total += n
		if n > bound {
			t.Errorf("shard %s owns %d partitions, bound %d", id, n, bound)
		}
		if n == 0 {
			t.Errorf("shard %s owns no partition", id)
		}
	}
	if total != cfg.PartitionCount || len(counts) != 12 {
		t.Fatalf("partition counts cover %d partitions over %d shards", total, len(counts))
	}

	// Keys: the contract's 1.25x mean, plus sampling noise (a shard's count
	// has a standard deviation under 1% of the mean here).
	seed := testSeed(t)
	keys := randomKeys(seed, 200_000)
	perShard := map[string]int{}
	for _, k := range keys {
		perShard[ring.Locate("default", k).ID]++
	}
	mean := float64(len(keys)) / 12
	for id, n := range perShard {
		if ratio := float64(n) / mean; ratio > 1.25+0.05 {
			t.Errorf("shard %s holds %.3fx the mean share of keys (seed %d)", id, ratio, seed)
		}
	}
	if len(perShard) != 12 {
		t.Errorf("keys reached %d shards, want 12", len(perShard))
	}
}

// TestAddingRegionMovesAboutItsShare: growing from 3 to 4 regions of 4 shards
// should move about 1/4 of the keys (the new shards' share). Bounded loads
// move a few more; the documented bound is 1.5x the ideal.
func TestAddingRegionMovesAboutItsShare(t *testing.T) {
	for _, tc := range []struct{ before, after []string }{
		{[]string{"ap-south", "eu-west", "us-east"}, []string{"ap-south", "eu-west", "us-east", "sa-east"}},
		{[]string{"us-east"}, []string{"us-east", "eu-west"}},
	} {
		old := mustRing(t, genTopology(tc.before, 3, 4, 3, SurvivalZone))
		grown := mustRing(t, genTopology(tc.after, 3, 4, 3, SurvivalZone))
		keys := randomKeys(7, 100_000)
		moved, toOld := 0, 0
		for _, k := range keys {
			a, b := old.Locate("default", k), grown.Locate("default", k)
			if a.ID != b.ID {
				moved++
				if _, ok := old.ShardByID(b.ID); ok {
					toOld++
				}
			}
		}
		ideal := 1 / float64(len(tc.after))
		frac := float64(moved) / float64(len(keys))
		t.Logf("%d -> %d regions: moved %.3f of keys (ideal %.3f, ratio %.2f); %.3f between old shards",
			len(tc.before), len(tc.after), frac, ideal, frac/ideal, float64(toOld)/float64(len(keys)))
		if frac > 1.5*ideal {
			t.Errorf("moved %.3f of keys, more than 1.5x the ideal %.3f", frac, ideal)
		}
		if frac < 0.5*ideal {
			t.Errorf("moved %.3f of keys, the new shards got too little (ideal %.3f)", frac, ideal)
		}
	}
}

func TestRingIsDeterministic(t *testing.T) {
	a := mustRing(t, loadTestdata(t, "three-region.yaml"))
	b := mustRing(t, loadTestdata(t, "three-region.json"))
	if a.Fingerprint() != b.Fingerprint() {
		t.Fatalf("YAML and JSON forms give fingerprints %s and %s", a.Fingerprint(), b.Fingerprint())
	}
	for _, k := range randomKeys(3, 20_000) {
		if x, y := a.Locate("ns", k), b.Locate("ns", k); x.ID != y.ID {
			t.Fatalf("key %q: %s vs %s", k, x.ID, y.ID)
		}
	}
}

func TestRingLookups(t *testing.T) {
	topo := loadTestdata(t, "three-region.yaml")
	ring := mustRing(t, topo)
	if ring.Cluster() != "demo" {
		t.Fatalf("Cluster() = %q", ring.Cluster())
	}
	shards := ring.Shards()
	if len(shards) != 12 {
		t.Fatalf("Shards() = %d", len(shards))
	}
	shards[0] = Shard{} // a copy: the ring must not change
	if ring.Shards()[0].ID != "ap-south-0" {
		t.Fatal("Shards() returned the ring's own slice")
	}
	s, ok := ring.ShardByID("eu-west-3")
	if !ok || s.HomeRegion != "eu-west" || s.Index != 3 || len(s.Voters) != 3 {
		t.Fatalf("ShardByID(eu-west-3) = %+v, %v", s, ok)
	}
	if _, ok := ring.ShardByID("eu-west-4"); ok {
		t.Fatal("ShardByID found eu-west-4")
	}
	got := ring.Locate("default", "order-1")
	want, _ := topo.ShardByID(got.ID)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Locate returned %+v, topology has %+v", got, want)
	}
}

func TestNewRingRejectsInvalidTopology(t *testing.T) {
	topo := validTopology()
	topo.Replicas = 0
	if _, err := NewRing(topo); !errors.Is(err, ErrInvalidTopology) {
		t.Fatalf("NewRing(invalid) err = %v, want ErrInvalidTopology", err)
	}
}

func TestLibraryPanicBecomesError(t *testing.T) {
	// A load factor below 1 leaves no room for every partition: the library
	// panics, and we must return ErrRing instead.
	shards := genTopology([]string{"a"}, 3, 3, 3, SurvivalZone).Shards()
	_, err := newConsistent(shards, RingConfig{PartitionCount: 100, ReplicationFactor: 10, Load: 0.5})
	if !errors.Is(err, ErrRing) || !strings.Contains(err.Error(), "not enough room") {
		t.Fatalf("err = %v, want ErrRing with the library's complaint", err)
	}
	if _, err := newConsistent(nil, RingConfig{PartitionCount: 100, ReplicationFactor: 10, Load: 1.25}); !errors.Is(err, ErrRing) {
		t.Fatalf("no shards: err = %v, want ErrRing", err)
	}
}

func TestFingerprint(t *testing.T) {
	base := loadTestdata(t, "three-region.yaml")
	fp := mustRing(t, base).Fingerprint()
	if len(fp) != 64 || strings.Trim(fp, "0123456789abcdef") != "" {
		t.Fatalf("fingerprint %q is not 64 hex digits", fp)
	}
	same := map[string]func(*Topology){
		"address change":   func(t *Topology) { t.Regions[0].Nodes[0].HTTPAddr = "10.1.2.3:8101" },
		"wan_rtt_ms":       func(t *Topology) { t.WANRTTMs = 150 },
		"explicit default": func(t *Topology) { t.Ring = RingConfig{PartitionCount: DefaultPartitionCount} },
		"region order": func(t *Topology) {
			t.Regions[0], t.Regions[2] = t.Regions[2], t.Regions[0]
		},
		"node order": func(t *Topology) {
			n := t.Regions[1].Nodes
			n[0], n[2] = n[2], n[0]
		},
	}
	for name, mutate := range same {
		topo := base.Clone()
		mutate(topo)
		if got := mustRing(t, topo).Fingerprint(); got != fp {
			t.Errorf("%s changed the fingerprint", name)
		}
	}
	differ := map[string]func(*Topology){
		"cluster":            func(t *Topology) { t.Cluster = "other" },
		"partition count":    func(t *Topology) { t.Ring.PartitionCount = 8191 },
		"replication factor": func(t *Topology) { t.Ring.ReplicationFactor = 50 },
		"load":               func(t *Topology) { t.Ring.Load = 1.5 },
		"shards per region":  func(t *Topology) { t.ShardsPerRegion = 5 },
		"survival":           func(t *Topology) { t.Survival = SurvivalZone },
		"node renamed":       func(t *Topology) { t.Regions[1].Nodes[1].ID = "eu-west-9" },
		"node added": func(t *Topology) {
			t.Regions[2].Nodes = append(t.Regions[2].Nodes, Node{ID: "us-east-4", RaftAddr: "127.0.0.1:7010", GRPCAddr: "127.0.0.1:7110", HTTPAddr: "127.0.0.1:8110"})
		},
	}
	for name, mutate := range differ {
		topo := base.Clone()
		mutate(topo)
		if got := mustRing(t, topo).Fingerprint(); got == fp {
			t.Errorf("%s left the fingerprint unchanged", name)
		}
	}
}

func TestLocateConcurrent(t *testing.T) {
	ring := mustRing(t, loadTestdata(t, "three-region.yaml"))
	keys := randomKeys(11, 2000)
	want := make([]string, len(keys))
	for i, k := range keys {
		want[i] = ring.Locate("ns", k).ID
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for range 8 {
		wg.Go(func() {
			for i, k := range keys {
				if got := ring.Locate("ns", k).ID; got != want[i] {
					errs <- fmt.Sprintf("key %q: %s, want %s", k, got, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestLocateDoesNotAllocate(t *testing.T) {
	ring := mustRing(t, loadTestdata(t, "three-region.yaml"))
	ns, key := strings.Repeat("n", 63), strings.Repeat("k", 255)
	var sink Shard
	allocs := testing.AllocsPerRun(1000, func() { sink = ring.Locate(ns, key) })
	if allocs != 0 {
		t.Fatalf("Locate allocates %.1f times per call", allocs)
	}
	_ = sink
}

// golden is testdata/golden.json: lookups that must never change, because
// data already stored under one release must be found by the next.
type golden struct {
	Comment string          `json:"comment"`
	Rings   []goldenTopoRef `json:"rings"`
}

type goldenTopoRef struct {
	Topology    string         `json:"topology"`
	Fingerprint string         `json:"fingerprint"`
	Vectors     []goldenVector `json:"vectors"`
}

type goldenVector struct {
	Namespace string `json:"namespace"`
	Key       string `json:"key"`
	Shard     string `json:"shard"`
}

func goldenInputs() [][2]string {
	var in [][2]string
	for _, k := range []string{"a", "order-1", "order-2", "0190b4d6-8f2a-7c3e-9b1d-5e6f7a8b9c0d", "key:with:colons", "a%2Fb", "~!@#$^&*()_+", strings.Repeat("z", 255)} {
		for _, ns := range []string{"default", "payments", "x", strings.Repeat("n", 63)} {
			in = append(in, [2]string{ns, k})
		}
	}
	for i := range 32 {
		in = append(in, [2]string{"default", fmt.Sprintf("key-%d", i)})
	}
	return in
}

func TestGoldenVectors(t *testing.T) {
	path := filepath.Join("testdata", "golden.json")
	topologies := []string{"three-node.yaml", "three-region.yaml"}
	if *update {
		g := golden{Comment: "key -> shard lookups that every release must reproduce; regenerate only on a deliberate, documented ring change (go test ./topology -run TestGoldenVectors -update)"}
		for _, name := range topologies {
			ring := mustRing(t, loadTestdata(t, name))
			ref := goldenTopoRef{Topology: name, Fingerprint: ring.Fingerprint()}
			for _, in := range goldenInputs() {
				ref.Vectors = append(ref.Vectors, goldenVector{Namespace: in[0], Key: in[1], Shard: ring.Locate(in[0], in[1]).ID})
			}
			g.Rings = append(g.Rings, ref)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(g); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (generate it with -update)", err)
	}
	var g golden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Rings) != len(topologies) {
		t.Fatalf("golden.json has %d rings, want %d", len(g.Rings), len(topologies))
	}
	for _, ref := range g.Rings {
		ring := mustRing(t, loadTestdata(t, ref.Topology))
		if ring.Fingerprint() != ref.Fingerprint {
			t.Errorf("%s: fingerprint %s, golden %s: placement or ring parameters changed", ref.Topology, ring.Fingerprint(), ref.Fingerprint)
		}
		if len(ref.Vectors) < 40 {
			t.Fatalf("%s: only %d golden vectors", ref.Topology, len(ref.Vectors))
		}
		shardsHit := map[string]bool{}
		for _, v := range ref.Vectors {
			shardsHit[v.Shard] = true
			if got := ring.Locate(v.Namespace, v.Key).ID; got != v.Shard {
				t.Errorf("%s: Locate(%q, %q) = %s, golden %s", ref.Topology, v.Namespace, v.Key, got, v.Shard)
			}
		}
		if len(shardsHit) < 2 {
			t.Errorf("%s: golden vectors reach only %v", ref.Topology, shardsHit)
		}
	}
}

func BenchmarkLocate(b *testing.B) {
	ring := mustRing(b, loadTestdata(b, "three-region.yaml"))
	keys := randomKeys(5, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		_ = ring.Locate("payments", keys[i&1023])
		i++
	}
}

func BenchmarkNewRing(b *testing.B) {
	topo := loadTestdata(b, "three-region.yaml")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewRing(topo); err != nil {
			b.Fatal(err)
		}
	}
}
