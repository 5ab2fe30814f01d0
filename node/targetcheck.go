package node

import (
	"fmt"
	"slices"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/server"
	"github.com/idem-dev/idem/topology"
)

// maxTargetBytes bounds a topology document a change may propose (the
// JSON API reads at most as much of a PUT /v1/topology body).
const maxTargetBytes = 1 << 20

// checkTarget returns why next, with the nodes dead, cannot be the target
// of a change from active (nil when it can): every dead node must be a
// node of active that next no longer lists, and the change must be one
// topology.Plan accepts. The cheap checks run first, so that a refused
// document costs no plan. The meta group's leader asks it before
// proposing a target, so that a refusal never reaches the meta log and
// costs no other node anything; the meta state machine asks it again when
// applying one.
func checkTarget(active, next *topology.Topology, dead []string) error {
	for i, d := range dead {
		if _, ok := active.NodeByID(d); !ok {
			return fmt.Errorf("--dead %s: no such node in the active topology", d)
		}
		if _, ok := next.NodeByID(d); ok {
			return fmt.Errorf("--dead %s: the new topology still lists it; a dead node must leave", d)
		}
		if slices.Contains(dead[:i], d) {
			return fmt.Errorf("--dead %s: named twice", d)
		}
	}
	_, err := topology.Plan(active, next)
	return err
}

// checkTargetBeforeProposing is checkTarget against this leader's meta
// state: a refusal is INVALID_ARGUMENT (or FAILED_PRECONDITION while
// another change runs) and nothing is proposed. A state the leader has
// not applied yet is left to the meta state machine.
func (n *Node) checkTargetBeforeProposing(next *topology.Topology, dead []string) error {
	mv, _ := n.meta.read()
	if mv.active == nil {
		return nil
	}
	if mv.target != nil {
		if topology.SameShape(mv.target, next) {
			return nil // the same change again: resumed
		}
		return &server.Error{Code: contract.CodeFailedPrecondition, Message: (&changeRunningError{version: mv.target.EffectiveVersion()}).Error()}
	}
	if err := checkTarget(mv.active, next, dead); err != nil {
		return &server.Error{Code: contract.CodeInvalidArgument, Message: err.Error()}
	}
	return nil
}
