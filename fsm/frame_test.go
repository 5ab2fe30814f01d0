package fsm

import (
	"bytes"
	"strings"
	"testing"
)

// TestRecordAtTheAPICeilingRestores: a record whose body is at the ceiling
// of --max-response-bytes (256 MiB) with 64 KiB of headers (the API's
// limit) and long strings fits in a snapshot frame: otherwise one such
// record would make every snapshot of its shard unrestorable. Needs ~1 GiB
// of memory; skipped with -short.
func TestRecordAtTheAPICeilingRestores(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~1 GiB")
	}
	const ceiling = 256 << 20 // server.MaxMaxResponseBytes
	headers := map[string]string{}
	for i := range 8 { // 8 x 8 KiB values: the API's 64 KiB of headers
		headers[strings.Repeat("h", 200)+string(rune('a'+i))] = strings.Repeat("v", 8<<10-256)
	}
	f := New()
	long := strings.Repeat("k", 4<<10)
	f.Apply(1, &Command{Op: OpReserve, Namespace: long, Key: long, Now: 1, OwnerToken: long, Fingerprint: long, Lease: 1e9})
	if r := f.Apply(2, &Command{Op: OpComplete, Namespace: long, Key: long, Now: 1, OwnerToken: long, Retention: 1e12,
		Response: &Response{Status: 200, Headers: headers, Body: make([]byte, ceiling)}}); r.Outcome != OutcomeOK {
		t.Fatal(r.Outcome)
	}
	var buf bytes.Buffer
	s := f.Snapshot()
	if _, err := s.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	s.Release()
	g := New()
	if err := g.Restore(&buf); err != nil {
		t.Fatalf("a snapshot holding a record at the API's ceiling does not restore: %v", err)
	}
	if rec, ok := g.Get(long, long, 1); !ok || len(rec.Response.Body) != ceiling {
		t.Fatal("restored record missing or cut")
	}
}
