// Package fsm is idem's idempotency state machine: the replicated heart of
// the store, pure and deterministic, with no I/O and no clock of its own.
//
// Every key (namespace, key) is absent, IN_PROGRESS (an owner holds it under
// a lease) or COMPLETED (its response is stored for replay until retention
// ends). Commands (reserve, heartbeat, complete, release, sweep) are applied
// in Raft log order by Apply; outcomes (ACQUIRED, RECLAIMED, IN_PROGRESS,
// COMPLETED, FINGERPRINT_MISMATCH, NOT_OWNER, OK) are values, not errors.
//
// Guarantees, each covered by tests against a reference model:
//   - At most one owner per key at any log position; the fencing token of an
//     acquisition is the log index of the entry that made it, so it is
//     strictly greater than every token issued for that key before.
//   - Time is part of each command (stamped by the proposer) and the FSM uses
//     max(command time, highest time applied), so it never runs backwards; a
//     lease can be reclaimed only after lease end plus the command's
//     clock-skew margin.
//   - The owner token of a repeated reserve or complete identifies a retry:
//     the same reservation (same fencing token) or the same completion times.
//   - Replicas applying the same log produce byte-identical snapshots.
//
// See DESIGN.md for the reasoning and trade-offs.
package fsm
