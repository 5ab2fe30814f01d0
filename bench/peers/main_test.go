package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Duration != 8*time.Second || cfg.Rounds != 3 || !slices.Equal(cfg.Concurrency, []int{1, 64, 256}) || !slices.Equal(cfg.Systems, allSystems) || cfg.BodyBytes != 512 || !cfg.Install {
		t.Errorf("defaults = %+v", cfg)
	}
	cfg, err = parseFlags([]string{"--systems", "redis, idem3-grpc,redis", "--concurrency", "64,1,64", "--rounds", "5", "--duration", "2s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	// Systems in table order, duplicates dropped; client counts as given.
	if !slices.Equal(cfg.Systems, []string{sysIdem3GRPC, sysRedis}) || !slices.Equal(cfg.Concurrency, []int{64, 1}) || cfg.Rounds != 5 || cfg.Duration != 2*time.Second {
		t.Errorf("parsed %+v", cfg)
	}
	if _, err := parseFlags([]string{"-h"}, &bytes.Buffer{}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // every one must appear
	}{
		{[]string{"--systems", "mysql"}, []string{`unknown system "mysql"`}},
		{[]string{"--systems", ""}, []string{"--systems is empty"}},
		{[]string{"--concurrency", "0,x"}, []string{`"0" is not a positive integer`, `"x" is not a positive integer`}},
		{[]string{"--duration", "0"}, []string{"--duration 0s"}},
		{[]string{"--rounds", "0", "--warmup", "-1s"}, []string{"--rounds 0", "--warmup -1s"}},
		{[]string{"--race-contenders", "1"}, []string{"--race-contenders 1"}},
		{[]string{"--profile-dir", "p", "--systems", "redis"}, []string{"--profile-dir profiles idem3-grpc"}},
		{[]string{"--profile-dir", "p", "--profile-clients", "32"}, []string{"--profile-clients 32 is not one of --concurrency"}},
		{[]string{"extra"}, []string{`unexpected argument "extra"`}},
		{[]string{"--nope"}, []string{"flag provided but not defined"}},
	} {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), tc.args, &stdout, &stderr)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("run(%q) = %v, want it to mention %q", tc.args, err, w)
			}
		}
		if stdout.Len() != 0 {
			t.Errorf("run(%q) printed %q", tc.args, stdout.String())
		}
	}
	var stderr bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, &bytes.Buffer{}, &stderr); err != nil || !strings.Contains(stderr.String(), "-concurrency") || !strings.Contains(stderr.String(), "Usage") {
		t.Errorf("--help = %v, printed %q", err, stderr.String())
	}
}

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

func TestRowsAndRatios(t *testing.T) {
	cells := []cell{
		// idem3-grpc at 64 clients: 1000, 3000, 2000 cycles/s over three rounds.
		{System: sysIdem3GRPC, Clients: 64, Round: 0, Cycles: 1000, Elapsed: time.Second, P50: ms(30), P99: ms(90), CPU: 1000 * ms(1.5), ClientCPU: 1000 * ms(0.2)},
		{System: sysIdem3GRPC, Clients: 64, Round: 1, Cycles: 6000, Elapsed: 2 * time.Second, P50: ms(20), P99: ms(60), CPU: 6000 * ms(1.2), ClientCPU: 6000 * ms(0.1)},
		{System: sysIdem3GRPC, Clients: 64, Round: 2, Cycles: 2000, Elapsed: time.Second, P50: ms(25), P99: ms(120), Failed: 2, FirstErr: "reserve: boom", CPU: 2000 * ms(1.4), ClientCPU: 2000 * ms(0.3)},
		{System: sysRedis, Clients: 64, Round: 0, Cycles: 16000, Elapsed: time.Second, P50: ms(3.4), P99: ms(7)},
		{System: sysRedis, Clients: 64, Round: 1, Cycles: 16000, Elapsed: time.Second, P50: ms(3.7), P99: ms(9)},
		{System: sysRedis, Clients: 64, Round: 2, Cycles: 20000, Elapsed: time.Second, P50: ms(3.5), P99: ms(8)},
		{System: sysEtcd, Clients: 64, Round: 0, Cycles: 2000, Elapsed: time.Second, P50: ms(26), P99: ms(80)},
		{System: sysEtcd, Clients: 1, Round: 0, Cycles: 0, Elapsed: time.Second},
		{System: sysIdem3GRPC, Clients: 1, Round: 0, Cycles: 300, Elapsed: time.Second, P50: ms(3.3), P99: ms(5)},
	}
	rs := rows(cells, []string{sysIdem3GRPC, sysRedis, sysEtcd}, []int{1, 64})
	if len(rs) != 5 {
		t.Fatalf("rows = %+v, want 5", rs)
	}
	r := rs[1]
	if r.System != sysIdem3GRPC || r.Clients != 64 || r.Rounds != 3 || r.Rate != 2000 || r.P50Lo != ms(20) || r.P50H != ms(30) || r.P99Lo != ms(60) || r.P99H != ms(120) || r.Failed != 2 || r.FirstErr != "reserve: boom" || r.CPUPerCycle != ms(1.4) {
		t.Errorf("idem3-grpc c=64 row = %+v", r)
	}
	if x, ok := ratio(rs, sysIdem3GRPC, sysRedis, 64); !ok || x != 2000.0/16000 {
		t.Errorf("ratio to redis = %v, %v; want 0.125", x, ok)
	}
	if _, ok := ratio(rs, sysIdem3GRPC, sysEtcd, 1); ok {
		t.Error("a ratio to a peer that measured nothing was given")
	}
	if _, ok := ratio(rs, sysIdem3GRPC, sysPostgres, 64); ok {
		t.Error("a ratio to a peer that did not run was given")
	}

	var b bytes.Buffer
	writeTable(&b, rs, 3)
	out := b.String()
	for _, want := range []string{
		"| system | clients | cycles/s (median of 3) | cycle p50 ms | cycle p99 ms | server CPU/cycle | client CPU/cycle | failed |",
		"| idem3-grpc | 64 | 2,000 | 20.0-30.0 | 60.0-120 | 1400 µs | 200 µs | 2 |",
		"| redis | 64 | 16,000 | 3.40-3.70 | 7.00-9.00 | ? | ? | 0 |",
		"| etcd | 1 | 0 | 0.00 | 0.00 | ? | ? | 0 |",
		"| idem / replicated peers (median cycles/s) | clients | / etcd |\n| --- | ---: | ---: |\n| idem3-grpc | 1 | - |\n| idem3-grpc | 64 | 1.00 |\n",
		"| idem / single-copy peers (median cycles/s) | clients | / redis |\n| --- | ---: | ---: |\n| idem3-grpc | 1 | - |\n| idem3-grpc | 64 | 0.12 |\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "/ postgres") {
		t.Errorf("table has a column for a peer that did not run:\n%s", out)
	}
}

func TestMedianAndPercentile(t *testing.T) {
	if m := median([]float64{5, 1, 3}); m != 3 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
	if m := median(nil); m != 0 {
		t.Errorf("median(nil) = %v", m)
	}
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	if p50, p99 := percentile(ds, 0.5), percentile(ds, 0.99); p50 != 50 || p99 != 99 {
		t.Errorf("p50, p99 of 1..100 = %v, %v", p50, p99)
	}
	if fmtThousands(16578.4) != "16,578" || fmtThousands(999) != "999" || fmtThousands(1234567) != "1,234,567" {
		t.Errorf("fmtThousands: %s %s %s", fmtThousands(16578.4), fmtThousands(999), fmtThousands(1234567))
	}
}

// memTarget is an in-memory store with the cycle's semantics, and two ways
// to break it that the harness must catch.
type memTarget struct {
	mu     sync.Mutex
	owners map[string]string
	done   map[string]bool
	broken bool // every reserve wins
	refuse bool // every complete is refused
}

func (m *memTarget) reserve(_ context.Context, key, owner string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, held := m.owners[key]; held && !m.broken {
		return false, nil
	}
	m.owners[key] = owner
	return true, nil
}

func (m *memTarget) complete(_ context.Context, key, owner string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owners[key] != owner || m.done[key] || m.refuse {
		return false, nil
	}
	m.done[key] = true
	return true, nil
}

func (m *memTarget) close() {}

func TestRaceAndCell(t *testing.T) {
	good := &system{name: "mem", tgt: &memTarget{owners: map[string]string{}, done: map[string]bool{}}}
	r := runRace(t.Context(), good, 10, 8)
	if !r.ok() || r.OneWinner != 10 || r.LoserTries != 70 || r.LoserRefuse != 70 || r.WinnerDone != 10 {
		t.Errorf("race on a correct store = %+v", r)
	}
	bad := &system{name: "broken", tgt: &memTarget{owners: map[string]string{}, done: map[string]bool{}, broken: true}}
	rb := runRace(t.Context(), bad, 5, 4)
	if rb.ok() || rb.OneWinner != 0 || rb.Winners[4] != 5 {
		t.Errorf("race on a store where everyone wins = %+v", rb)
	}
	var b bytes.Buffer
	if writeRace(&b, []raceResult{r, rb}) || !strings.Contains(b.String(), "| broken | 5 x 4 | 0 | 4:5 |") || !strings.Contains(b.String(), "| mem | 10 x 8 | 10 | 1:10 | 70/70 | 10/10 | 0 | ok |") {
		t.Errorf("race table:\n%s", b.String())
	}

	c := runCell(t.Context(), good, 4, 10*time.Millisecond, 100*time.Millisecond)
	if c.Cycles == 0 || c.Failed != 0 || c.P50 <= 0 || c.P99 < c.P50 || c.Elapsed < 100*time.Millisecond {
		t.Errorf("cell on a correct store = %+v", c)
	}
	// A store that refuses every complete fails every cycle.
	refusing := &system{name: "refusing", tgt: &memTarget{owners: map[string]string{}, done: map[string]bool{}, refuse: true}}
	c = runCell(t.Context(), refusing, 2, 0, 50*time.Millisecond)
	if c.Cycles != 0 || c.Failed == 0 || !strings.Contains(c.FirstErr, "was refused") {
		t.Errorf("cell on a refusing store = %+v", c)
	}
}

func TestParsePacking(t *testing.T) {
	text := `# HELP idem_raft_proposal_entry_commands Commands per Raft entry
idem_raft_proposal_entry_commands_bucket{shard="us-east-0",le="1"} 3
idem_raft_proposal_entry_commands_sum{shard="us-east-0"} 120
idem_raft_proposal_entry_commands_count{shard="us-east-0"} 30
idem_raft_proposal_entry_commands_sum{shard="us-east-1"} 80
idem_raft_proposal_entry_commands_count{shard="us-east-1"} 10
idem_raft_apply_batch_commands_sum{shard="us-east-1"} 999
`
	sum, count, err := parsePacking(text)
	if err != nil || sum != 200 || count != 40 {
		t.Errorf("parsePacking = %v, %v, %v; want 200, 40", sum, count, err)
	}
	if _, _, err := parsePacking("idem_raft_proposal_entry_commands_sum{shard=\"a\"} x\n"); err == nil {
		t.Error("a malformed value was accepted")
	}
}

// The plain variants turn packing off (idemnode packs by default), the pack
// variants on.
func TestPackArgs(t *testing.T) {
	for variant, want := range map[string]string{"idem3": "--raft-pack-commands=off", "idem1": "--raft-pack-commands=off",
		"idem3pack": "--raft-pack-commands=on", "idem1pack": "--raft-pack-commands=on"} {
		if got := packArgs(variant); len(got) != 1 || got[0] != want {
			t.Errorf("packArgs(%s) = %v, want [%s]", variant, got, want)
		}
	}
}

func TestIdemShape(t *testing.T) {
	for variant, want := range map[string][2]int{"idem3": {3, 4}, "idem3pack": {3, 4}, "idem1pack": {1, 4},
		"idem3s1": {3, 1}, "idem3s1pack": {3, 1}, "idem3s12": {3, 12}} {
		if n, s := idemShape(variant); n != want[0] || s != want[1] {
			t.Errorf("idemShape(%s) = %d nodes, %d shards; want %v", variant, n, s, want)
		}
	}
}

func TestIdemNodeBAddsTwins(t *testing.T) {
	cfg, err := parseFlags([]string{"--systems", "redis,idem3pack-grpc,idem1-grpc", "--idemnode-b", "/tmp/b"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"idem3pack-grpc", "idem3pack-grpc@b", "idem1-grpc", "idem1-grpc@b", "redis"}
	if !slices.Equal(cfg.Systems, want) {
		t.Fatalf("systems %v, want %v", cfg.Systems, want)
	}
	if _, err := parseFlags([]string{"--systems", "redis", "--idemnode-b", "/tmp/b"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--idemnode-b") {
		t.Fatalf("--idemnode-b without idem systems: %v", err)
	}
}

func TestWriteABPairsRounds(t *testing.T) {
	c := func(sys string, round, cycles int, cpuMs float64) cell {
		return cell{System: sys, Clients: 64, Round: round, Cycles: cycles, Elapsed: time.Second, CPU: time.Duration(float64(cycles) * cpuMs * float64(time.Millisecond))}
	}
	cells := []cell{
		c("idem3-grpc", 0, 1000, 0.5), c("idem3-grpc@b", 0, 1100, 0.4),
		c("idem3-grpc", 1, 2000, 0.5), c("idem3-grpc@b", 1, 2400, 0.5),
		c("idem3-grpc", 2, 1000, 0.5), c("idem3-grpc@b", 2, 1300, 0.45),
		c("redis", 0, 9000, 0.1),
	}
	var b bytes.Buffer
	writeAB(&b, cells, []string{"idem3-grpc", "idem3-grpc@b", "redis"}, []int{64})
	if want := "| idem3-grpc@b / idem3-grpc | 64 | 3 | 1.20 (1.10-1.30) | 0.90 (0.80-1.00) |"; !strings.Contains(b.String(), want) {
		t.Fatalf("a/b table lacks %q:\n%s", want, b.String())
	}
	b.Reset()
	writeAB(&b, cells, []string{"idem3-grpc", "redis"}, []int{64})
	if b.Len() != 0 {
		t.Fatalf("a/b table without twins: %q", b.String())
	}
}

// --trace-ratios adds a traced twin of every idem system, which the b / a
// table pairs with it.
func TestTraceRatios(t *testing.T) {
	cfg, err := parseFlags([]string{"--systems", "redis,idem3s1pack-grpc", "--trace-ratios", "1,0.01"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"idem3s1pack-grpc", "idem3s1pack-grpc@trace1", "idem3s1pack-grpc@trace0.01", "redis"}
	if !slices.Equal(cfg.Systems, want) {
		t.Fatalf("systems %v, want %v", cfg.Systems, want)
	}
	if base, twin := twinOf("idem3s1pack-grpc@trace0.01"); base != "idem3s1pack-grpc" || twin != "@trace0.01" {
		t.Errorf("twinOf: %q %q", base, twin)
	}
	cells := []cell{
		{System: "idem3s1pack-grpc", Clients: 64, Cycles: 1000, Elapsed: time.Second, CPU: time.Second},
		{System: "idem3s1pack-grpc@trace1", Clients: 64, Cycles: 800, Elapsed: time.Second, CPU: time.Second},
	}
	var b bytes.Buffer
	writeAB(&b, cells, []string{"idem3s1pack-grpc", "idem3s1pack-grpc@trace1"}, []int{64})
	if want := "| idem3s1pack-grpc@trace1 / idem3s1pack-grpc | 64 | 1 | 0.80 (0.80-0.80) | 1.25 (1.25-1.25) |"; !strings.Contains(b.String(), want) {
		t.Fatalf("b / a table lacks %q:\n%s", want, b.String())
	}
	for _, bad := range []string{"1.5", "-0.1", "x"} {
		if _, err := parseFlags([]string{"--systems", "idem3-grpc", "--trace-ratios", bad}, &bytes.Buffer{}); err == nil {
			t.Errorf("--trace-ratios %s accepted", bad)
		}
	}
	if _, err := parseFlags([]string{"--systems", "redis", "--trace-ratios", "1"}, &bytes.Buffer{}); err == nil {
		t.Error("--trace-ratios without an idem system accepted")
	}
}

func TestRegionShapes(t *testing.T) {
	cfg, err := parseFlags([]string{"--systems", "redis,idem3s6pack-grpc,idem3pack-grpc,idem3s3-json"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"idem3pack-grpc", "idem3s3-json", "idem3s6pack-grpc", "redis"}; !slices.Equal(cfg.Systems, want) {
		t.Fatalf("systems %v, want %v", cfg.Systems, want)
	}
	for _, bad := range []string{"idem3s0pack-grpc", "idem3s300-grpc", "idem1s3-grpc", "idem3s3-http", "idem3s3packed-grpc"} {
		if _, err := parseFlags([]string{"--systems", bad}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "unknown system") {
			t.Errorf("--systems %s: %v", bad, err)
		}
	}
}
