package node

import (
	"flag"
	"strings"
	"testing"
	"time"
)

// TestPackGate: a shard packs once every voter other than this node
// advertised packed-entries in a fresh answer; an old voter, one never
// heard from or one whose answer is stale holds it back; a shard whose
// state already holds packed entries packs at once; and once on it stays on
// whatever the answers say afterwards.
func TestPackGate(t *testing.T) {
	voters := []string{"n1", "n2", "n3"}
	now := time.Now()
	ok := peerClock{mid: now, packedEntries: true}
	old := peerClock{mid: now} // answered without the feature
	stale := peerClock{mid: now.Add(-2 * clockEstimateTTL), packedEntries: true}
	for _, tc := range []struct {
		name         string
		fresh        map[string]peerClock
		packedBefore bool
		on           bool
		why          string // in the reason
	}{
		{"every voter advertises", map[string]peerClock{"n2": ok, "n3": ok}, false, true, "n1, n2, n3"},
		{"one old voter", map[string]peerClock{"n2": ok, "n3": old}, false, false, "n3"},
		{"a voter never heard from", map[string]peerClock{"n2": ok}, false, false, "n3"},
		{"no answer at all", nil, false, false, "n2, n3"},
		{"a non-voter's answer does not count", map[string]peerClock{"n2": ok, "n4": ok}, false, false, "n3"},
		{"state already packed", map[string]peerClock{"n2": ok}, true, true, "already holds packed entries"},
	} {
		g := newPackGate("n1")
		on, switched, why := g.decide("s1", voters, tc.fresh, tc.packedBefore)
		if on != tc.on || switched != tc.on || !strings.Contains(why, tc.why) {
			t.Errorf("%s: decide = on %v, switched %v, %q; want on and switched %v, reason naming %q", tc.name, on, switched, why, tc.on, tc.why)
		}
	}

	// A stale answer is as good as none: fresh drops it (clocks.fresh).
	c := &clocks{readings: map[string]peerClock{"n2": ok, "n3": stale}, legacy: map[string]bool{}}
	g := newPackGate("n1")
	if on, _, why := g.decide("s1", voters, c.fresh(), false); on || !strings.Contains(why, "n3") {
		t.Errorf("a stale answer from n3: on %v (%s), want off naming n3", on, why)
	}

	// Latched: once on, a voter turning old or going silent changes nothing,
	// and only the first call reports the switch. Other shards are their own.
	if on, switched, _ := g.decide("s1", voters, map[string]peerClock{"n2": ok, "n3": ok}, false); !on || !switched {
		t.Fatal("every voter advertises: not switched on")
	}
	for _, fresh := range []map[string]peerClock{{"n2": ok, "n3": old}, nil} {
		if on, switched, _ := g.decide("s1", voters, fresh, false); !on || switched {
			t.Fatalf("after the switch with %v: on %v, switched %v; want on, not switched again", fresh, on, switched)
		}
	}
	if on, _, _ := g.decide("s2", voters, map[string]peerClock{"n2": ok, "n3": old}, false); on {
		t.Fatal("another shard with an old voter is on")
	}

	// A one-voter shard (this node only) needs no answer.
	if on, _, _ := newPackGate("n1").decide("s1", []string{"n1"}, nil, false); !on {
		t.Fatal("a shard whose only voter is this node is off")
	}
}

// A node with PackOff advertises nothing: on the wire its Clock answer is
// that of a release without packing.
func TestFeaturesAdvertised(t *testing.T) {
	for mode, want := range map[PackMode]int{PackAuto: 1, PackOn: 1, PackOff: 0} {
		n := &Node{cfg: Config{PackCommands: mode}}
		if got := n.features(); len(got) != want || (want == 1 && got[0] != FeaturePackedEntries) {
			t.Errorf("%s: features %v", mode, got)
		}
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
