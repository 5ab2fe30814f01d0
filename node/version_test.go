package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
)

// TestMinVersion: the cluster version the nodes support together is the
// lowest advertised; a node not heard from counts as the baseline; the
// nodes below the wanted version are named, with what they advertise.
func TestMinVersion(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	for _, tc := range []struct {
		name     string
		versions map[string]int
		own      int
		low      int
		behind   string
	}{
		{"every node upgraded", map[string]int{"n2": 3, "n3": 3}, 3, 3, ""},
		{"one node on packing only", map[string]int{"n2": 3, "n3": 2}, 3, 2, "n3 (advertises 2)"},
		{"a node never heard from", map[string]int{"n2": 3}, 3, 1, "n3 (not heard from)"},
		{"no answer at all", nil, 3, 1, "n2 (not heard from), n3 (not heard from)"},
		{"this node holds back (off)", map[string]int{"n2": 3, "n3": 3}, 1, 1, "n1 (advertises 1)"},
		{"a node outside the count does not count", map[string]int{"n2": 3, "n3": 3, "n4": 1}, 3, 3, ""},
	} {
		low, behind := minVersion(nodes, "n1", tc.own, tc.versions, VersionPartitionHandoff)
		if low != tc.low || strings.Join(behind, ", ") != tc.behind {
			t.Errorf("%s: min %d, behind %q; want %d, %q", tc.name, low, behind, tc.low, tc.behind)
		}
	}
}

// TestPeerVersion: a peer's Clock answer gives its version; a release
// before the cluster version counts by its features.
func TestPeerVersion(t *testing.T) {
	for _, tc := range []struct {
		resp *idemv1.ClockResponse
		want int
	}{
		{&idemv1.ClockResponse{AdvertisedVersion: 3, Features: []string{featurePackedEntries}}, 3},
		{&idemv1.ClockResponse{AdvertisedVersion: 1}, 1},
		{&idemv1.ClockResponse{Features: []string{featurePackedEntries}}, VersionPackedEntries},
		{&idemv1.ClockResponse{}, VersionBaseline},
	} {
		if got := peerVersion(tc.resp); got != tc.want {
			t.Errorf("%v: version %d, want %d", tc.resp, got, tc.want)
		}
	}
}

// A node with PackOff advertises the baseline, and its Clock answer is on
// the wire that of a release without packing (no features); the others
// advertise their release's version and packed-entries for the leaders of
// a release before the cluster version.
func TestAdvertisedVersion(t *testing.T) {
	for mode, want := range map[PackMode]int{PackAuto: ReleaseVersion, PackOn: ReleaseVersion, PackOff: VersionBaseline} {
		n := &Node{cfg: Config{PackCommands: mode}}
		got := n.advertisedVersion()
		if got != want {
			t.Errorf("%s: advertises %d, want %d", mode, got, want)
		}
		if f := clockFeatures(got); (len(f) == 1) != (mode != PackOff) {
			t.Errorf("%s: features %v", mode, f)
		}
	}
}

// TestMetaClusterVersion: the meta state machine raises the cluster
// version, never lowers it, keeps it through topology commands and in its
// snapshot.
func TestMetaClusterVersion(t *testing.T) {
	m := newMetaSM()
	apply := func(index uint64, cmd metaCommand) {
		t.Helper()
		data, err := json.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if res := m.Apply(index, data); res != nil {
			t.Fatalf("apply %+v: %v", cmd, res)
		}
	}
	version := func(m *metaSM) int { mv, _ := m.read(); return mv.clusterVersion }
	if v := version(m); effectiveVersion(v) != VersionBaseline {
		t.Fatalf("fresh meta state: cluster version %d", v)
	}
	apply(1, metaCommand{Op: "cluster-version", ClusterVersion: 2})
	apply(2, metaCommand{Op: "cluster-version", ClusterVersion: 1}) // a stale proposal
	if v := version(m); v != 2 {
		t.Fatalf("after 2 then 1: cluster version %d, want 2", v)
	}
	apply(3, metaCommand{Op: "progress", At: 5})
	apply(4, metaCommand{Op: "cluster-version", ClusterVersion: 3})
	if v := version(m); v != 3 {
		t.Fatalf("after 3: cluster version %d", v)
	}
	snap, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := snap.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	restored := newMetaSM()
	if err := restored.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if v := version(restored); v != 3 {
		t.Fatalf("restored from the snapshot: cluster version %d, want 3", v)
	}
}

// TestCheckClusterVersion: a data dir whose cluster version (recorded, or
// in the restored meta state) is above this release's is refused; the
// record only goes up.
func TestCheckClusterVersion(t *testing.T) {
	dir := t.TempDir()
	if err := checkClusterVersion(dir, 0); err != nil {
		t.Fatalf("a data dir without a record: %v", err)
	}
	if err := writeClusterVersion(dir, ReleaseVersion); err != nil {
		t.Fatal(err)
	}
	if err := writeClusterVersion(dir, VersionBaseline); err != nil {
		t.Fatal(err)
	}
	if v, err := readClusterVersion(dir); err != nil || v != ReleaseVersion {
		t.Fatalf("record after writing %d then %d: %d, %v", ReleaseVersion, VersionBaseline, v, err)
	}
	if err := checkClusterVersion(dir, 0); err != nil {
		t.Fatalf("this release's own version: %v", err)
	}
	if err := checkClusterVersion(dir, ReleaseVersion+1); !errors.Is(err, ErrClusterVersion) {
		t.Fatalf("meta state above the release: %v, want ErrClusterVersion", err)
	}
	if err := writeClusterVersion(dir, ReleaseVersion+1); err != nil {
		t.Fatal(err)
	}
	err := checkClusterVersion(dir, 0)
	if !errors.Is(err, ErrClusterVersion) || !strings.Contains(err.Error(), "not supported") {
		t.Fatalf("record above the release: %v, want ErrClusterVersion saying why", err)
	}
}

func TestParsePackMode(t *testing.T) {
	for in, want := range map[string]PackMode{"auto": PackAuto, "on": PackOn, "true": PackOn, "OFF": PackOff, "false": PackOff} {
		if got, err := ParsePackMode(in); err != nil || got != want {
			t.Errorf("ParsePackMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParsePackMode("sometimes"); err == nil {
		t.Error("ParsePackMode accepted sometimes")
	}
	// As a flag: bare means on, =true/=false still work, and the default
	// prints as auto.
	for _, tc := range []struct {
		args []string
		want PackMode
	}{{nil, PackAuto}, {[]string{"--pack"}, PackOn}, {[]string{"--pack=off"}, PackOff}, {[]string{"--pack=false"}, PackOff},
		{[]string{"--pack=true"}, PackOn}, {[]string{"--pack=auto"}, PackAuto}, {[]string{"--pack", "--pack=off"}, PackOff}} {
		var m PackMode
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.Var(&m, "pack", "")
		if err := fs.Parse(tc.args); err != nil || m != tc.want {
			t.Errorf("%v: %v, %v; want %v", tc.args, m, err, tc.want)
		}
		if fs.Lookup("pack").DefValue != "auto" {
			t.Errorf("default prints as %q", fs.Lookup("pack").DefValue)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	var m PackMode
	fs.Var(&m, "pack", "")
	if err := fs.Parse([]string{"--pack=sometimes"}); err == nil {
		t.Error("--pack=sometimes accepted")
	}
}

// A node whose meta replica shows a cluster version above its release's
// (an older release that joined a newer cluster) records it and stops; at
// or below, it records it and goes on.
func TestNoteClusterVersionAboveRelease(t *testing.T) {
	n := &Node{cfg: Config{DataDir: t.TempDir()}, meta: newMetaSM(), failed: make(chan struct{}),
		clusterVersionGauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"}), log: slog.New(slog.DiscardHandler)}
	raise := func(index uint64, v int) {
		data, _ := json.Marshal(metaCommand{Op: "cluster-version", ClusterVersion: v})
		if res := n.meta.Apply(index, data); res != nil {
			t.Fatal(res)
		}
		n.noteClusterVersion()
	}
	raise(1, ReleaseVersion)
	if rec, _ := readClusterVersion(n.cfg.DataDir); rec != ReleaseVersion || n.failure.Load() != nil {
		t.Fatalf("at this release's version: record %d, failure %v", rec, n.failure.Load())
	}
	raise(2, ReleaseVersion+1)
	select {
	case <-n.failed:
	default:
		t.Fatal("a cluster version above the release did not stop the node")
	}
	if err := *n.failure.Load(); !errors.Is(err, ErrClusterVersion) {
		t.Fatalf("failure %v, want ErrClusterVersion", err)
	}
	if err := checkClusterVersion(n.cfg.DataDir, 0); !errors.Is(err, ErrClusterVersion) {
		t.Fatalf("restart on the data dir: %v, want a refusal", err)
	}
}
