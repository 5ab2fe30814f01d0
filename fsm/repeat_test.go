package fsm

import (
	"reflect"
	"testing"
)

// TestRepeatedCompleteAnswersAsTheLogWould: RepeatedComplete answers only
// a complete the log would answer OK without changing anything, and then
// with the result Apply gives; every other complete goes to the log.
func TestRepeatedCompleteAnswersAsTheLogWould(t *testing.T) {
	a := newApplier(t)
	a.want(reserveCmd("k", "owner-a", "", t0), OutcomeAcquired)
	a.want(reserveCmd("open", "owner-o", "", t0), OutcomeAcquired)
	done := a.want(completeCmd("k", "owner-a", t0+sec, "ok"), OutcomeOK)
	for _, tc := range []struct {
		name   string
		cmd    *Command
		answer bool
	}{
		{"identical repeat", completeCmd("k", "owner-a", t0+2*sec, "ok"), true},
		{"another response", completeCmd("k", "owner-a", t0+2*sec, "changed"), false},
		{"another owner", completeCmd("k", "owner-b", t0+2*sec, "ok"), false},
		{"a key in progress", completeCmd("open", "owner-o", t0+2*sec, "ok"), false},
		{"a key never reserved", completeCmd("none", "owner-a", t0+2*sec, "ok"), false},
		{"past the retention", completeCmd("k", "owner-a", done.ExpiresAt, "ok"), false},
		{"not a complete", heartbeatCmd("k", "owner-a", t0+2*sec), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := a.f.Get("ns", tc.cmd.Key, tc.cmd.Now)
			res, ok := a.f.RepeatedComplete(tc.cmd)
			if ok != tc.answer {
				t.Fatalf("answered from the state: %v, want %v", ok, tc.answer)
			}
			if !ok {
				return
			}
			applied := a.apply(tc.cmd)
			if !reflect.DeepEqual(res, applied) {
				t.Fatalf("from the state %+v, from the log %+v", res, applied)
			}
			after, _ := a.f.Get("ns", tc.cmd.Key, tc.cmd.Now)
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("applying the repeat changed the record: %+v -> %+v", before, after)
			}
		})
	}
}
