package backend

import (
	"context"
	"errors"
	"time"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

// Backend executes validated commands. The storage node implements it over
// its Raft shards, the router by forwarding to the shard's leader, Mem over
// one state machine in memory.
type Backend interface {
	// Apply executes an OpReserve, OpHeartbeat, OpComplete, OpRelease,
	// OpForceRelease or OpDelete command. A reserve with Wait > 0 waits (up
	// to Wait, on the node that leads the key's shard) for an IN_PROGRESS
	// key to stop being in progress, as Waiters.Reserve does. The server has validated it and applied defaults (Lease,
	// Retention in nanoseconds); for a reserve it has already set
	// cmd.OwnerToken (contract.NewOwnerToken when the client sent none), so
	// that forwarding and retries downstream stay idempotent. Now and
	// SkewMargin are left 0: the proposer stamps them.
	Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error)
	// Get returns the record, or found=false when it is absent or past
	// retention. Linearizable.
	Get(ctx context.Context, namespace, key string) (rec fsm.Record, found bool, err error)
	// List answers one page of a namespace's keys across every shard
	// (ListShards). Reads are linearizable per shard.
	List(ctx context.Context, q ListQuery) (ListPage, error)
	// Ready reports whether the process can serve (nil) or why not.
	Ready(ctx context.Context) error
}

// ErrUnavailable: the store could not decide in time (no leader reachable,
// home region lost, deadline passed). Clients see 503 UNAVAILABLE (gRPC
// Unavailable) with a Retry-After hint.
var ErrUnavailable = errors.New("backend: store unavailable")

// UnavailableError is an ErrUnavailable with a reason and a retry hint.
type UnavailableError struct {
	// RetryAfter is when the client should try again; 0 means one second.
	RetryAfter time.Duration
	// Reason says why, in words a client may see ("no leader for shard
	// us-east/2", "home region eu-west unreachable").
	Reason string
}

func (e *UnavailableError) Error() string {
	if e.Reason == "" {
		return ErrUnavailable.Error()
	}
	return ErrUnavailable.Error() + ": " + e.Reason
}

// Unwrap makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Unwrap() error { return ErrUnavailable }

// NotLeaderError: this process does not lead the shard and did not forward
// the command. Leader is the node id it believes leads (empty: unknown).
type NotLeaderError struct {
	Shard  string
	Leader string
}

func (e *NotLeaderError) Error() string {
	msg := "backend: not the leader of shard " + e.Shard
	if e.Leader != "" {
		msg += " (the leader is " + e.Leader + ")"
	}
	return msg
}

// Unwrap makes errors.Is(err, ErrUnavailable) hold: for a client, a missing
// leader is an undecided request.
func (e *NotLeaderError) Unwrap() error { return ErrUnavailable }

// Error is a refusal or decision with a public code that a backend passes on
// unchanged, typically the answer of the node it forwarded to.
type Error struct {
	Code    contract.Code
	Message string
	// RetryAfter, when set, is the client's retry hint.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return "backend: " + string(e.Code) + ": " + e.Message }

// Routed is a Backend that takes part in forwarding (a storage node, the
// router). The gRPC service passes it how often the request was forwarded
// before (hops, from the wire's hop count) and tells its caller the leader
// it returns (on the wire, as the leader hint): data in and out of the call,
// not values hidden in the context. A Backend that is not Routed is called
// through Apply and Get, with no hops and no leader hint.
type Routed interface {
	Backend
	// ApplyRouted is Apply for a request forwarded hops times. leader is the
	// node id believed to lead the key's shard ("" when unknown).
	ApplyRouted(ctx context.Context, cmd *fsm.Command, hops int) (res fsm.Result, leader string, err error)
	// GetRouted is Get for a request forwarded hops times, with the leader
	// as in ApplyRouted.
	GetRouted(ctx context.Context, namespace, key string, hops int) (rec fsm.Record, found bool, leader string, err error)
}

// AsRouted returns b as a Routed: b itself when it is one, otherwise an
// adapter that ignores hops and knows no leader.
func AsRouted(b Backend) Routed {
	if r, ok := b.(Routed); ok {
		return r
	}
	return unrouted{b}
}

type unrouted struct{ Backend }

func (u unrouted) ApplyRouted(ctx context.Context, cmd *fsm.Command, _ int) (fsm.Result, string, error) {
	res, err := u.Apply(ctx, cmd)
	return res, "", err
}

func (u unrouted) GetRouted(ctx context.Context, namespace, key string, _ int) (fsm.Record, bool, string, error) {
	rec, found, err := u.Get(ctx, namespace, key)
	return rec, found, "", err
}

// Policies is a Backend that stores namespace policies (API v1.2). A
// backend that is not one answers the policy endpoints UNIMPLEMENTED.
type Policies interface {
	// SetPolicy applies cmd (an fsm.OpSetPolicy) to every shard group and
	// returns once each applied it, so that every request accepted after it
	// returns is decided under the policy.
	SetPolicy(ctx context.Context, cmd *fsm.Command) (fsm.Policy, error)
	// GetPolicy returns the policy stored for namespace (found=false: none,
	// the built-in defaults apply).
	GetPolicy(ctx context.Context, namespace string) (p fsm.Policy, found bool, err error)
}

// SetPolicyShards applies a set-policy to every shard in ids through apply
// (which proposes it on the shard's leader, or forwards it there), all at
// once, and returns once each applied it: the first error otherwise (the
// policy may then be in force on some shards; the call is safe to repeat).
func SetPolicyShards(ctx context.Context, ids []string, apply func(ctx context.Context, id string) error) error {
	errs := make(chan error, len(ids))
	for _, id := range ids {
		go func() { errs <- apply(ctx, id) }()
	}
	var first error
	for range ids {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
