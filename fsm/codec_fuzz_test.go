package fsm

import (
	"errors"
	"reflect"
	"testing"
)

// fuzzCommands are well-formed commands of every op, the seeds of
// FuzzDecodeCommand (testdata/fuzz/FuzzDecodeCommand holds their encodings
// and some malformed ones).
func fuzzCommands() []*Command {
	return []*Command{
		{Op: OpReserve, Namespace: "pay", Key: "order-42", Now: 1_700_000_000_000_000_000, Fingerprint: "fp", OwnerToken: "owner", Lease: 30e9, SkewMargin: 1e9},
		{Op: OpHeartbeat, Namespace: "pay", Key: "k", Now: 5, OwnerToken: "o", Lease: 1e9},
		{Op: OpComplete, Namespace: "pay", Key: "k", Now: 6, OwnerToken: "o", Retention: 86400e9,
			Response: &Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json", "X-A": ""}, Body: []byte(`{"ok":true}`)}},
		{Op: OpRelease, Namespace: "pay", Key: "k", Now: 7, OwnerToken: "o"},
		{Op: OpSweep, Now: 8, AbandonAfter: 3600e9, MaxSweep: 100},
	}
}

// FuzzDecodeCommand feeds arbitrary bytes to the log-entry decoder, as a
// corrupt or forged Raft entry would: it must never panic; what it accepts
// must survive an encode/decode round trip unchanged; and applying any
// entry to a fresh FSM must not panic either (bytes that do not decode are
// OutcomeInvalid).
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range fuzzCommands() {
		f.Add(EncodeCommand(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cmd, err := DecodeCommand(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeCommand error %v does not wrap ErrCorrupt", err)
			}
		} else {
			again, err := DecodeCommand(EncodeCommand(cmd))
			if err != nil {
				t.Fatalf("re-decoding an accepted command: %v", err)
			}
			if !reflect.DeepEqual(cmd, again) {
				t.Fatalf("round trip changed the command:\n%#v\n%#v", cmd, again)
			}
		}
		New().ApplyEntry(1, data)
	})
}
