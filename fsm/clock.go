package fsm

import "slices"

// QuorumTime is the time a command carrying clock readings brings: the
// median of readings (Unix nanoseconds, one per voter of the group whose
// clock the proposer could read, its own included), provided at least
// quorum of them lie within bound nanoseconds of that median. ok is false
// otherwise: the clocks of a majority do not agree, and no time can be
// trusted. A minority of clocks, however far off (the proposer's own
// included), can neither move the median beyond the majority's range nor
// make up a quorum, so time never jumps ahead of the quorum's. With an even
// count the lower median is taken: a clock that runs behind only delays
// expiries, one that runs ahead would end leases and retention early.
//
// The node calls it before proposing (and answers UNAVAILABLE when ok is
// false); the state machine calls it again on apply, so a proposer that
// skipped the check still cannot stamp a time the quorum does not share.
func QuorumTime(readings []int64, quorum int, bound int64) (now int64, ok bool) {
	if quorum < 1 || len(readings) < quorum {
		return 0, false
	}
	sorted := slices.Clone(readings)
	slices.Sort(sorted)
	median := sorted[(len(sorted)-1)/2]
	agree := 0
	for _, r := range sorted {
		if d := r - median; d <= bound && -d <= bound {
			agree++
		}
	}
	return median, agree >= quorum
}

// commandTime is the time cmd brings, before max() with the FSM's clock.
// A command with ClockQuorum set takes QuorumTime of its readings; one
// without (the in-memory backend, tests, entries proposed before clock
// readings existed) takes Now, its proposer's single clock.
func commandTime(cmd *Command) (int64, bool) {
	if cmd.ClockQuorum == 0 {
		return cmd.Now, true
	}
	return QuorumTime(cmd.ClockReadings, cmd.ClockQuorum, cmd.ClockBound)
}
