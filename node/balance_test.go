package node

import "testing"

func TestBalancerDecision(t *testing.T) {
	voters := []string{"a", "b", "c"} // a is preferred
	facts := func(self, leader string, down bool) balanceFacts {
		return balanceFacts{Shard: "r-0", Self: self, Voters: voters, Preferred: "a", Leader: leader, PreferredDown: down}
	}
	// step is one tick: what the node sees, what it must decide, and
	// whether the hand-back it asked for succeeded.
	type step struct {
		see      balanceFacts
		want     string // a reason
		succeeds bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a follower never transfers", []step{
			{see: facts("b", "a", false), want: reasonNotLeader},
			{see: facts("b", "c", false), want: reasonNotLeader},
			{see: facts("b", "", false), want: reasonNotLeader},
		}},
		{"the preferred voter keeps its leadership", []step{
			{see: facts("a", "a", false), want: reasonPreferred},
			{see: facts("a", "a", false), want: reasonPreferred},
			{see: facts("a", "a", false), want: reasonPreferred},
		}},
		{"another leader hands back after settling", []step{
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonHandBack, succeeds: true},
			{see: facts("b", "a", false), want: reasonNotLeader},
		}},
		{"a failed attempt backs off, then retries", []step{
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonHandBack},
			{see: facts("b", "b", false), want: reasonBackingOff},
			{see: facts("b", "b", false), want: reasonBackingOff},
			{see: facts("b", "b", false), want: reasonHandBack},
		}},
		{"a down preferred voter is not tried until it is back", []step{
			{see: facts("b", "b", true), want: reasonSettling},
			{see: facts("b", "b", true), want: reasonSettling},
			{see: facts("b", "b", true), want: reasonPreferredDown},
			{see: facts("b", "b", true), want: reasonPreferredDown},
			{see: facts("b", "b", false), want: reasonHandBack},
		}},
		{"losing and regaining leadership settles afresh", []step{
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "c", false), want: reasonNotLeader},
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonHandBack},
		}},
		{"a leadership won back right after a hand-back waits out the retry spacing", []step{
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonHandBack, succeeds: true},
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonSettling},
			{see: facts("b", "b", false), want: reasonHandBack},
		}},
		{"a preferred voter outside the voters is never a target", []step{
			{see: balanceFacts{Shard: "r-0", Self: "b", Voters: []string{"b", "c"}, Preferred: "a", Leader: "b"}, want: reasonNotAVoter},
			{see: balanceFacts{Shard: "r-0", Self: "b", Voters: []string{"b", "c"}, Preferred: "a", Leader: "b"}, want: reasonNotAVoter},
			{see: balanceFacts{Shard: "r-0", Self: "b", Voters: []string{"b", "c"}, Preferred: "a", Leader: "b"}, want: reasonNotAVoter},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBalancer()
			for i, s := range tc.steps {
				d := b.next([]balanceFacts{s.see})[0]
				if d.Reason != s.want {
					t.Fatalf("tick %d (%+v): decided %+v, want reason %q", i+1, s.see, d, s.want)
				}
				if d.Transfer != (s.want == reasonHandBack) || d.Transfer && d.To != s.see.Preferred {
					t.Fatalf("tick %d: decision %+v is inconsistent with its reason", i+1, d)
				}
				if s.succeeds {
					b.handedOver(s.see.Shard)
				}
			}
		})
	}
}

// TestBalancerKeepsShardsApart: one shard's settling or back-off never
// delays another's.
func TestBalancerKeepsShardsApart(t *testing.T) {
	b := newBalancer()
	leads := func(shard string) balanceFacts {
		return balanceFacts{Shard: shard, Self: "b", Voters: []string{"a", "b", "c"}, Preferred: "a", Leader: "b"}
	}
	b.next([]balanceFacts{leads("x-0")})
	b.next([]balanceFacts{leads("x-0")})
	got := b.next([]balanceFacts{leads("x-0"), leads("y-0")})
	if !got[0].Transfer || got[1].Reason != reasonSettling {
		t.Fatalf("decisions %+v: want x-0 handed back and y-0 settling", got)
	}
}
