// Package wire converts between the messages of api/idem/v1 and the Go
// types of the serving side: the state machine's (fsm: results, records,
// policies, listed keys, states, reserve outcomes) and the closed error set
// of package backend (BackendError). Every package that serves or forwards
// the API uses it (server, forward, node, proxy); the Go client never does,
// so a program that links only the client links no state machine.
//
// Each conversion comes in a To/From pair, and wire_test.go checks that
// every pair round-trips. The conversions that need no state machine
// (error codes and statuses, wire outcomes, times) stay in api/idem/v1.
package wire
