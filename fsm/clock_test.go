package fsm

import (
	"slices"
	"testing"
)

func TestQuorumTime(t *testing.T) {
	const bound = sec / 2
	hour := 3600 * sec
	for _, tc := range []struct {
		name     string
		readings []int64
		quorum   int
		want     int64
		ok       bool
	}{
		{"one voter", []int64{t0}, 1, t0, true},
		{"three agree", []int64{t0 + 100, t0, t0 - 100}, 2, t0, true},
		{"the proposer hours ahead is outvoted", []int64{t0 + 3*hour, t0, t0 + 10}, 2, t0 + 10, true},
		{"the proposer hours behind is outvoted", []int64{t0 - 3*hour, t0, t0 + 10}, 2, t0, true},
		{"a year ahead alone", []int64{t0 + 365*24*hour}, 2, 0, false},
		{"two that disagree cannot tell which is wrong", []int64{t0 + 3*hour, t0}, 2, 0, false},
		{"two within the bound: the lower", []int64{t0 + bound, t0}, 2, t0, true},
		{"too few readings", []int64{t0, t0}, 3, 0, false},
		{"five, two far ahead", []int64{t0, t0 + 1, t0 + 2, t0 + hour, t0 + 2*hour}, 3, t0 + 2, true},
		{"five, three scattered", []int64{t0, t0 + hour, t0 + 2*hour, t0 + 3*hour, t0 + 4*hour}, 3, 0, false},
		{"no quorum asked", []int64{t0}, 0, 0, false},
	} {
		readings := slices.Clone(tc.readings)
		got, ok := QuorumTime(tc.readings, tc.quorum, bound)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%s: QuorumTime(%v, %d) = %d, %v; want %d, %v", tc.name, tc.readings, tc.quorum, got, ok, tc.want, tc.ok)
		}
		if !slices.Equal(readings, tc.readings) {
			t.Errorf("%s: readings were reordered", tc.name)
		}
	}
}

// TestSkewedProposerCannotExpireEarly: a sweep whose proposer's own clock
// is a year ahead, stamped with the voters' readings, drops nothing and
// does not advance the FSM's clock past the quorum's; a sweep carrying only
// that clock and a quorum of two is refused without effect.
func TestSkewedProposerCannotExpireEarly(t *testing.T) {
	f := New()
	year := 365 * 24 * 3600 * sec
	stamp := func(c *Command, readings ...int64) *Command {
		c.ClockReadings, c.ClockQuorum, c.ClockBound = readings, 2, sec/2
		c.Now = readings[0]
		return c
	}
	idx := uint64(0)
	apply := func(c *Command) Result { idx++; return f.Apply(idx, c) }
	if r := apply(stamp(reserveCmd("k", "owner", "", 0), t0, t0+1, t0+2)); r.Outcome != OutcomeAcquired {
		t.Fatalf("reserve: %v", r.Outcome)
	}
	if r := apply(stamp(completeCmd("k", "owner", 0, "done"), t0+sec, t0+sec, t0+sec)); r.Outcome != OutcomeOK {
		t.Fatalf("complete: %v", r.Outcome)
	}
	if r := apply(stamp(&Command{Op: OpSweep}, t0+year, t0+2*sec, t0+2*sec)); r.Outcome == OutcomeInvalid || r.Swept != 0 {
		t.Fatalf("sweep by a proposer a year ahead, outvoted: %+v", r)
	}
	if r := apply(stamp(&Command{Op: OpSweep}, t0+year)); r.Outcome != OutcomeInvalid || r.Swept != 0 {
		t.Fatalf("sweep with one clock where two must agree: %+v", r)
	}
	if r := apply(stamp(reserveCmd("k", "other", "", 0), t0+3*sec, t0+3*sec, t0+year)); r.Outcome != OutcomeCompleted {
		t.Fatalf("replay after the skewed sweeps: %v, want COMPLETED", r.Outcome)
	}
	if rec, ok := f.Get("ns", "k", t0+4*sec); !ok || rec.State != StateCompleted {
		t.Fatalf("record after the skewed sweeps: %+v %v", rec, ok)
	}
}

func TestCommandCodecClockReadings(t *testing.T) {
	c := reserveCmd("k", "owner", "fp", t0)
	c.ClockReadings, c.ClockQuorum, c.ClockBound = []int64{t0, t0 - 5, t0 + 7}, 2, sec/2
	got, err := DecodeCommand(EncodeCommand(c))
	if err != nil || !slices.Equal(got.ClockReadings, c.ClockReadings) || got.ClockQuorum != 2 || got.ClockBound != sec/2 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	// An entry without readings (as written before they existed) decodes
	// with ClockQuorum 0: its time is Now.
	legacy := reserveCmd("k", "owner", "fp", t0)
	got, err = DecodeCommand(EncodeCommand(legacy))
	if err != nil || got.ClockQuorum != 0 || got.ClockReadings != nil {
		t.Fatalf("legacy: %+v %v", got, err)
	}
}
