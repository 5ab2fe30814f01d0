package node

import (
	"context"

	"github.com/idem-dev/idem/fsm"
)

// repeatedComplete answers cmd, a stamped complete on a replica s that
// leads, from the state when it repeats the key's completion identically
// (fsm.RepeatedComplete): the contract answers such a repeat 200 with the
// same completed_at, and proposing it would write the whole response to
// every replica's log again for nothing (48 repeated 4 MiB batch-completes
// grew every data dir to 245 MB for 2.7 MB of bodies). The state is read
// after a read barrier, so the answer is the one the log would give; ok is
// false when cmd must be proposed. The first check, before the barrier,
// costs one record read, so a complete that changes something pays no
// barrier.
func (n *Node) repeatedComplete(ctx context.Context, s *shard, cmd *fsm.Command) (fsm.Result, bool) {
	if cmd.Op != fsm.OpComplete {
		return fsm.Result{}, false
	}
	if _, ok := s.fsm.RepeatedComplete(cmd); !ok {
		return fsm.Result{}, false
	}
	if err := s.group.ReadBarrier(ctx); err != nil {
		return fsm.Result{}, false // the log decides (and answers the error)
	}
	res, ok := s.fsm.RepeatedComplete(cmd)
	if ok {
		n.repeats.Inc()
	}
	return res, ok
}
