package regionsim

import "testing"

func TestPhaseOfAnAttempt(t *testing.T) {
	faults := [2]int64{10, 20} // the faults' span, ns since the start
	for _, c := range []struct {
		name       string
		start, end int64
		span       [2]int64
		want       string
	}{
		{"ended before the first fault", 1, 9, faults, "before"},
		{"caught midway by the first fault", 5, 15, faults, "during"},
		{"outlived every fault", 5, 25, faults, "during"},
		{"inside the faults", 12, 18, faults, "during"},
		{"started under a fault, ended after", 18, 25, faults, "during"},
		{"started as the last fault ended", 20, 22, faults, "after"},
		{"started after", 21, 30, faults, "after"},
		{"no faults, started before the load's end", 5, 15, [2]int64{10, 10}, "before"},
		{"no faults, started at the load's end", 10, 15, [2]int64{10, 10}, "after"},
	} {
		if got := phaseOf(c.start, c.end, c.span); got != c.want {
			t.Errorf("%s (%d..%d, faults %v): phase %q, want %q", c.name, c.start, c.end, c.span, got, c.want)
		}
	}
}
