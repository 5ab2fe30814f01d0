// Package backend is the boundary between the public API (package server)
// and what executes its commands: the Backend interface, the closed set of
// errors a Backend may return, and Mem, the one in-memory Backend over the
// real state machine that tests and client/idemtest use.
//
// A Backend returns nil or one of:
//
//   - *UnavailableError (or anything wrapping ErrUnavailable): no decision
//     was reached in time; the client may retry with the same owner token.
//   - *NotLeaderError: this process cannot decide because another node leads
//     the shard; the leader hint is data (NotLeaderError.Leader), not
//     metadata. It unwraps to ErrUnavailable.
//   - *Error: a refusal or decision with a public code (contract.Code) that
//     the backend passes on, e.g. the answer of a node a request was
//     forwarded to (INVALID_ARGUMENT, PAYLOAD_TOO_LARGE, PERMISSION_DENIED).
//   - context.Canceled or context.DeadlineExceeded (possibly wrapped): the
//     caller's context ended first; treated as UNAVAILABLE.
//
// Anything else is a bug of the backend, and clients see INTERNAL. Decisions
// of the state machine (NOT_OWNER, IN_PROGRESS, ...) are not errors: they
// are the fsm.Result's Outcome.
//
// Two pieces of the v1.1 API (docs/api.md) live here because the node, the router
// and Mem share them: ListShards, the paging of a key listing across shards
// (an opaque token of (shard id, last key examined), bounded work per page),
// and Waiters, the reserves waiting for an in-flight key, woken by the apply
// that ends its in-progress state or at its reclaim time (never by polling).
package backend
