// Package ledger is regionsim's simulated downstream: a payment provider that
// records charges per idempotency key and, with its fencing guard on, refuses
// a write whose fencing token is lower than the highest it has seen for that
// key (the standard fencing-token pattern). It does not deduplicate by key on
// its own: preventing a second charge is the job of whatever coordinates the
// workers (idem, or the naive lock regionsim compares it with), which is
// exactly what regionsim measures.
package ledger
