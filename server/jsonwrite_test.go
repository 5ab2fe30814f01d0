package server

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/idem-dev/idem/fsm"
)

// encodingJSON is what writeJSON writes for v.
func encodingJSON(t *testing.T, v any) string {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// The hand-written answers are encoding/json's bytes for every reserve
// outcome, odd strings included.
func FuzzAppendedAnswersMatchEncodingJSON(f *testing.F) {
	f.Add(uint8(0), "owner-0123456789abcdef", "Content-Type", "application/json", []byte("body"), "step", int64(1764840000123456789), uint64(7))
	f.Add(uint8(1), "o\"w\\n\u2028", "X-\xff", "<&>\t\n", []byte{}, "é", int64(0), uint64(0))
	f.Add(uint8(2), "", "", "", []byte(nil), "", int64(-1), uint64(1<<63))
	f.Add(uint8(3), "tok", "a", "b", []byte{0, 1, 2}, "\x00", int64(1), uint64(18446744073709551615))
	f.Add(uint8(4), "tok", "a", "b", []byte("x"), "cp", int64(5e9), uint64(3))
	f.Fuzz(func(t *testing.T, which uint8, owner, hname, hvalue string, body []byte, cpName string, at int64, token uint64) {
		outcomes := []fsm.Outcome{fsm.OutcomeAcquired, fsm.OutcomeReclaimed, fsm.OutcomeInProgress, fsm.OutcomeCompleted, fsm.OutcomeExpired, fsm.OutcomeFingerprintMismatch}
		res := fsm.Result{
			Outcome: outcomes[int(which)%len(outcomes)], OwnerToken: owner, FencingToken: token, PreviousFencingToken: token / 2,
			LeaseExpiresAt: at, CompletedAt: at + 1, ExpiresAt: at + 2, ExpiredAt: at + 3, RetryAfter: at,
			Response:   &fsm.Response{Status: int32(at % 600), Headers: map[string]string{hname: hvalue, hvalue: hname}, Body: body},
			Checkpoint: &fsm.Checkpoint{Name: cpName, Data: body, FencingToken: token, At: at},
		}
		if which&0x80 != 0 {
			res.Response.Headers, res.Checkpoint = nil, nil
		}
		out := reserveJSON(&fsm.Command{Op: fsm.OpReserve, OwnerToken: owner}, res)
		if got, want := string(appendReserveJSON(nil, &out)), encodingJSON(t, out); got != want {
			t.Fatalf("reserve answer\n got %s\nwant %s", got, want)
		}
		// A nil header map (never built by storedResponseJSON, but the
		// struct allows it).
		out.Response = &responseJSON{Status: 1, Body: owner}
		if got, want := string(appendReserveJSON(nil, &out)), encodingJSON(t, out); got != want {
			t.Fatalf("reserve answer with nil headers\n got %s\nwant %s", got, want)
		}
		c := completeJSON{CompletedAt: owner, ExpiresAt: formatTime(at)}
		if got, want := string(appendCompleteJSON(nil, c)), encodingJSON(t, c); got != want {
			t.Fatalf("complete answer\n got %s\nwant %s", got, want)
		}
		hb := heartbeatJSON{LeaseExpiresAt: hvalue}
		if got, want := string(appendHeartbeatJSON(nil, hb)), encodingJSON(t, hb); got != want {
			t.Fatalf("heartbeat answer\n got %s\nwant %s", got, want)
		}
	})
}
