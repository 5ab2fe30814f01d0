package node

import (
	"strings"
	"testing"
	"time"
)

// TestClockSkewVerdict: a node calls its own clock skewed only when the
// median of the clocks it sees (its own counting as zero offset, each
// peer's offset shrunk by half its round trip) is past the bound; one bad
// peer, a slow round trip, or stale readings do not make it so.
func TestClockSkewVerdict(t *testing.T) {
	const bound = 500 * time.Millisecond
	hour := time.Hour
	type reading struct {
		offset, rtt time.Duration
		age         time.Duration
	}
	for _, tc := range []struct {
		name     string
		readings []reading
		skewed   bool
	}{
		{"no readings yet", nil, false},
		{"peers agree", []reading{{10 * time.Millisecond, time.Millisecond, 0}, {-5 * time.Millisecond, time.Millisecond, 0}}, false},
		{"this node 3h ahead: both peers 3h behind", []reading{{-3 * hour, time.Millisecond, 0}, {-3 * hour, time.Millisecond, 0}}, true},
		{"this node 3h behind", []reading{{3 * hour, time.Millisecond, 0}, {3 * hour, 2 * time.Millisecond, 0}}, true},
		{"one peer off: it is the peer", []reading{{3 * hour, time.Millisecond, 0}, {time.Millisecond, time.Millisecond, 0}}, false},
		{"one peer, off: cannot tell who", []reading{{3 * hour, time.Millisecond, 0}}, false},
		{"within the bound once the round trip is allowed for", []reading{{700 * time.Millisecond, 500 * time.Millisecond, 0}, {700 * time.Millisecond, 500 * time.Millisecond, 0}}, false},
		{"past the bound beyond the round trip", []reading{{900 * time.Millisecond, 100 * time.Millisecond, 0}, {900 * time.Millisecond, 100 * time.Millisecond, 0}}, true},
		{"stale readings are not used", []reading{{-3 * hour, time.Millisecond, time.Minute}, {-3 * hour, time.Millisecond, time.Minute}}, false},
	} {
		c := &clocks{bound: bound, readings: map[string]peerClock{}, legacy: map[string]bool{}}
		c.peersp.Store(&[]string{"p0", "p1"})
		for i, r := range tc.readings {
			c.readings["p"+string(rune('0'+i))] = peerClock{offset: r.offset, rtt: r.rtt, mid: time.Now().Add(-r.age)}
		}
		err := c.skewed()
		if (err != nil) != tc.skewed {
			t.Errorf("%s: skewed() = %v, want skewed %v", tc.name, err, tc.skewed)
		}
		if err != nil && !strings.Contains(err.Error(), "--max-clock-offset") {
			t.Errorf("%s: the reason does not name the flag: %v", tc.name, err)
		}
	}
	off := &clocks{bound: -1, readings: map[string]peerClock{"p0": {offset: -3 * hour, mid: time.Now()}}}
	off.peersp.Store(&[]string{"p0"})
	if err := off.skewed(); err != nil {
		t.Fatalf("check off: %v", err)
	}
}
