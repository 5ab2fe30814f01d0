package node

import "slices"

// Leader balancing: each shard's preferred leader is Voters[0], in its home
// region (placement spreads preferred leaderships evenly over each region's
// nodes). A node that leads a shard whose preferred voter is another node
// hands the leadership back, so that leaders stay spread over the nodes and,
// under region survival, leadership comes home once the home region
// recovers. The decision below is a pure function of what the node sees at
// each tick of its balance loop, so its rules are table-tested without Raft
// or clocks.

// Balancer tick counts (one tick is Config.LeaderBalanceInterval).
const (
	// balanceSettleTicks: a leadership is only handed over once this node
	// has held it for this many ticks, so a leader elected a moment ago
	// (the preferred voter may be restarting) is not moved at once.
	balanceSettleTicks = 2
	// balanceRetryTicks: at most one attempt per shard in this many ticks,
	// so a preferred voter that is down or lagging costs a failed attempt
	// now and then, never a flapping leader.
	balanceRetryTicks = 3
)

// balanceFacts is what the decision sees of one shard at one tick.
type balanceFacts struct {
	// Shard is the shard's id.
	Shard string
	// Self is this node's id.
	Self string
	// Voters are the shard's voters; Preferred is the one that should lead
	// (Voters[0]).
	Voters    []string
	Preferred string
	// Leader is the node this node believes leads the shard, "" when none
	// is known.
	Leader string
	// PreferredDown: this node has evidence that the preferred voter cannot
	// be reached now (its connection is failing). Unknown counts as up.
	PreferredDown bool
}

// balanceDecision is the decision for one shard at one tick.
type balanceDecision struct {
	// Transfer says to hand the shard's leadership To the preferred voter.
	Transfer bool
	To       string
	// Reason says why (or why not), for logs and tests.
	Reason string
}

// Reasons of a balanceDecision.
const (
	reasonNotLeader     = "not the leader"
	reasonPreferred     = "already the preferred voter"
	reasonNotAVoter     = "preferred voter is not a voter"
	reasonSettling      = "leadership not yet settled"
	reasonPreferredDown = "preferred voter is down"
	reasonBackingOff    = "a recent attempt"
	reasonHandBack      = "hand back to the preferred voter"
)

// balancer holds, per shard, how long this node has led it and when it last
// tried to hand it back, counted in ticks.
type balancer struct {
	tick    int
	ledFrom map[string]int // shard -> first tick of the current leadership
	lastTry map[string]int // shard -> tick of the last hand-back attempt
}

func newBalancer() *balancer {
	return &balancer{ledFrom: map[string]int{}, lastTry: map[string]int{}}
}

// next advances the balancer by one tick and decides for every shard in
// facts.
func (b *balancer) next(facts []balanceFacts) []balanceDecision {
	b.tick++
	out := make([]balanceDecision, len(facts))
	for i, f := range facts {
		out[i] = b.decide(f)
	}
	return out
}

func (b *balancer) decide(f balanceFacts) balanceDecision {
	if f.Leader != f.Self {
		delete(b.ledFrom, f.Shard)
		return balanceDecision{Reason: reasonNotLeader}
	}
	if f.Preferred == f.Self {
		delete(b.ledFrom, f.Shard)
		return balanceDecision{Reason: reasonPreferred}
	}
	if !slices.Contains(f.Voters, f.Preferred) {
		return balanceDecision{Reason: reasonNotAVoter}
	}
	from, ok := b.ledFrom[f.Shard]
	if !ok {
		from = b.tick
		b.ledFrom[f.Shard] = from
	}
	if b.tick-from < balanceSettleTicks {
		return balanceDecision{Reason: reasonSettling}
	}
	if last, tried := b.lastTry[f.Shard]; tried && b.tick-last < balanceRetryTicks {
		return balanceDecision{Reason: reasonBackingOff}
	}
	if f.PreferredDown {
		return balanceDecision{Reason: reasonPreferredDown}
	}
	b.lastTry[f.Shard] = b.tick
	return balanceDecision{Transfer: true, To: f.Preferred, Reason: reasonHandBack}
}

// handedOver records that shard's leadership left this node: a later
// leadership of it settles afresh.
func (b *balancer) handedOver(shard string) { delete(b.ledFrom, shard) }
