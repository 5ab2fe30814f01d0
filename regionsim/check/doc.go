// Package check holds regionsim's checkers: each takes what a run recorded
// (the history of calls to idem, the ledger's charges, the responses clients
// received, the final reads) and reports every violation of one invariant:
//
//   - ExactlyOnce: no key charged twice; every completed key charged exactly
//     once, by the charge its stored response names.
//   - Replays: every response a client received for a key is identical to
//     the first, and every replay equals what the owner stored.
//   - Linearizability: each key's reserve/heartbeat/complete/release/get
//     history has a linearization under a sequential model of the contract
//     (Model), checked with github.com/anishathalye/porcupine.
//   - NoLoss: every acknowledged completion reads back unchanged at the end.
//
// The tests feed each checker histories with a known violation (a double
// charge, a changed replay, a lost completion, a non-linearizable history)
// and assert that it is reported.
package check
