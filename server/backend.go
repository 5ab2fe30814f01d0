package server

import (
	"context"
	"errors"
	"time"

	"github.com/idem-dev/idem/backend"

	"github.com/idem-dev/idem/fsm"
)

// apply runs cmd on the backend and turns failures and NOT_OWNER into API
// errors. A reserve comes back with one of its five outcomes; the other
// commands with OK.
func (s *Server) apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, *Error) {
	res, _, e := s.applyRouted(ctx, cmd, 0)
	return res, e
}

// applyRouted is apply for a request forwarded hops times; leader is the
// backend's leader hint for the caller (empty when it knows none).
func (s *Server) applyRouted(ctx context.Context, cmd *fsm.Command, hops int) (fsm.Result, string, *Error) {
	res, leader, err := s.backend.ApplyRouted(ctx, cmd, hops)
	if err != nil {
		return res, leaderHint(leader, err), s.backendError(ctx, err, cmd.Op.String(), cmd.Namespace, cmd.Key)
	}
	if res.Outcome == fsm.OutcomeLimitExceeded {
		return res, leader, limitExceeded(cmd, res)
	}
	if cmd.Op == fsm.OpReserve {
		switch res.Outcome {
		case fsm.OutcomeAcquired, fsm.OutcomeReclaimed, fsm.OutcomeInProgress, fsm.OutcomeCompleted, fsm.OutcomeFingerprintMismatch, fsm.OutcomeExpired:
			return res, leader, nil
		}
	} else {
		switch res.Outcome {
		case fsm.OutcomeOK:
			return res, leader, nil
		case fsm.OutcomeNotOwner:
			return res, leader, notOwner(cmd.Op)
		}
	}
	// OutcomeInvalid means the server built a command the state machine
	// rejects; any other outcome is a backend bug. Neither is the client's.
	s.log.ErrorContext(ctx, "backend returned an unexpected outcome", "op", cmd.Op.String(),
		"namespace", cmd.Namespace, "key", cmd.Key, "outcome", res.Outcome.String())
	return res, leader, &Error{Code: CodeInternal, Message: internalMessage}
}

// getRouted is get for a request forwarded hops times, with the backend's
// leader hint.
func (s *Server) getRouted(ctx context.Context, namespace, key string, hops int) (fsm.Record, bool, string, *Error) {
	rec, found, leader, err := s.backend.GetRouted(ctx, namespace, key, hops)
	if err != nil {
		return rec, false, leaderHint(leader, err), s.backendError(ctx, err, "get", namespace, key)
	}
	return rec, found, leader, nil
}

// leaderHint is the leader a backend named, or the one its NotLeaderError
// names.
func leaderHint(leader string, err error) string {
	var nle *backend.NotLeaderError
	if leader == "" && errors.As(err, &nle) {
		return nle.Leader
	}
	return leader
}

// backendError logs with the request's context (its trace and span ids
// when it is traced).
func (s *Server) backendError(ctx context.Context, err error, op, namespace, key string) *Error {
	e, internal := fromBackend(err)
	if internal {
		s.log.ErrorContext(ctx, "backend failed", "op", op, "namespace", namespace, "key", key, "error", err)
	} else if e.Code == CodeUnavailable {
		s.log.DebugContext(ctx, "backend unavailable", "op", op, "namespace", namespace, "key", key, "error", err)
	}
	return e
}

// limitExceeded is the INVALID_ARGUMENT of a request that asked for more
// than its namespace's policy allows, naming the limit.
func limitExceeded(cmd *fsm.Command, res fsm.Result) *Error {
	asked, unit := cmd.Lease/int64(time.Millisecond), "lease_ms"
	if res.Limit == "max_retention_s" {
		asked, unit = cmd.Retention/int64(time.Second), "retention_s"
	}
	return errorf(CodeInvalidArgument, "%s %d exceeds the %s %d of namespace %q's policy: ask for at most that, or leave %s out for the namespace's default",
		unit, asked, res.Limit, res.LimitValue, cmd.Namespace, unit)
}

func notOwner(op fsm.Op) *Error {
	var msg string
	switch op {
	case fsm.OpHeartbeat:
		msg = "you do not own this key: it does not exist, is completed, or another caller reclaimed it after your lease ran out; stop the work and do not complete it"
	case fsm.OpComplete:
		msg = "you do not own this key: it does not exist, another caller reclaimed it after your lease ran out, or it was completed with a different response; do not treat your result as stored"
	default:
		msg = "you do not own this key: it does not exist, another caller holds it, or it is completed (a completed record is final and only expires)"
	}
	return &Error{Code: CodeNotOwner, Message: msg}
}
