package fsm

import (
	"strings"
	"testing"
)

// EncodeCommand and AppendRecord size their buffer once: they run for every
// command on every replica, and a buffer that grows is allocated again.
func TestEncodersAllocateOnce(t *testing.T) {
	resp := &Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json", strings.Repeat("x", 200): strings.Repeat("y", 300)}, Body: []byte(strings.Repeat("b", 512))}
	cmd := &Command{Op: OpComplete, Namespace: "orders", Key: strings.Repeat("k", 200), Now: 1 << 62, Fingerprint: "sha256:" + strings.Repeat("f", 64),
		OwnerToken: strings.Repeat("o", 40), Lease: -1 << 62, SkewMargin: 1 << 62, Response: resp, Retention: 1 << 62, AbandonAfter: 1 << 62, MaxSweep: 1 << 30,
		ClockQuorum: 2, ClockBound: 1 << 62, ClockReadings: []int64{-1 << 62, 1 << 62, 1 << 62}}
	if n := testing.AllocsPerRun(100, func() { EncodeCommand(cmd) }); n != 1 {
		t.Errorf("EncodeCommand: %v allocations, want 1", n)
	}
	rec := &Record{State: StateCompleted, Fingerprint: cmd.Fingerprint, OwnerToken: cmd.OwnerToken, FencingToken: 1 << 63, PreviousFencingToken: 1 << 63,
		LeaseExpiresAt: -1 << 62, CreatedAt: 1 << 62, CompletedAt: 1 << 62, ExpiresAt: 1 << 62, Response: resp}
	k := RecordKey{Namespace: cmd.Namespace, Key: cmd.Key}
	// appendResponse sorts the header names in a slice of its own: one more.
	if n := testing.AllocsPerRun(100, func() { AppendRecord(nil, k, rec) }); n > 2 {
		t.Errorf("AppendRecord: %v allocations, want at most 2", n)
	}
}
