package server

import (
	"encoding/json"
	"fmt"
	"maps"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
)

// Promises of the contract that the endpoint tests do not pin down.

// TestZeroNumbersTakeDefaults: "A numeric field that is 0 or absent takes
// its default": lease_ms 0 is a 30 s lease (reserve and heartbeat),
// retention_s 0 keeps the record 24 h.
func TestZeroNumbersTakeDefaults(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	now := clock.Now()
	r := h.do("POST", ns+"zero:reserve", `{"lease_ms":0,"owner_token":"owner-zero-0000001"}`)
	if r.status != 200 || r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("reserve with lease_ms 0: %d %s", r.status, r)
	}
	if got, want := str(t, r.body, "lease_expires_at"), rfc3339(now+int64(30*time.Second)); got != want {
		t.Fatalf("lease_ms 0: lease ends %s, want %s (the 30 s default)", got, want)
	}
	clock.Advance(time.Second)
	r = h.do("POST", ns+"zero:heartbeat", `{"lease_ms":0,"owner_token":"owner-zero-0000001"}`)
	if got, want := str(t, r.body, "lease_expires_at"), rfc3339(clock.Now()+int64(30*time.Second)); r.status != 200 || got != want {
		t.Fatalf("heartbeat with lease_ms 0: %d %s, want lease end %s", r.status, r, want)
	}
	r = h.do("POST", ns+"zero:complete", `{"owner_token":"owner-zero-0000001","retention_s":0,"response":{"status":200}}`)
	if r.status != 200 {
		t.Fatalf("complete with retention_s 0: %d %s", r.status, r)
	}
	if got, want := str(t, r.body, "expires_at"), rfc3339(clock.Now()+int64(24*time.Hour)); got != want || str(t, r.body, "completed_at") != rfc3339(clock.Now()) {
		t.Fatalf("retention_s 0: %s, want expires_at %s (the 24 h default)", r, want)
	}
}

// TestStoredHeadersReplayExactly: "Headers are stored and replayed exactly
// as given (names and values)": no canonicalisation of names, tabs and
// UTF-8 in values kept, through the JSON replay, the JSON read and gRPC.
func TestStoredHeadersReplayExactly(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	headers := map[string]string{
		"x-lower-case":      "a\tb",
		"X-MiXeD-cAsE":      "ünïcødé ✓ €",
		"content-type":      "text/plain; charset=utf-8",
		"X-Multiple-Values": "1, 2,\t3",
		"x-empty":           "",
	}
	r := h.do("POST", ns+"hdr:reserve", `{"owner_token":"owner-headers-00001"}`)
	if r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("reserve: %s", r)
	}
	body := fmt.Sprintf(`{"owner_token":"owner-headers-00001","response":{"status":201,"headers":%s}}`, jsonOf(t, headers))
	if r := h.do("POST", ns+"hdr:complete", body); r.status != 200 {
		t.Fatalf("complete: %d %s", r.status, r)
	}
	check := func(where string, got map[string]any) {
		t.Helper()
		want := map[string]any{}
		for k, v := range headers {
			want[k] = v
		}
		if !maps.Equal(got, want) {
			t.Fatalf("%s: headers %q, want exactly %q", where, got, want)
		}
	}
	replay := h.do("POST", ns+"hdr:reserve", `{}`)
	resp, _ := replay.body["response"].(map[string]any)
	hdrs, _ := resp["headers"].(map[string]any)
	check("JSON replay", hdrs)
	read := h.do("GET", ns+"hdr", "")
	resp, _ = read.body["response"].(map[string]any)
	hdrs, _ = resp["headers"].(map[string]any)
	check("JSON read", hdrs)
	got, err := h.grpc.Get(t.Context(), &idemv1.GetRequest{Namespace: "payments", Key: "hdr"})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got.GetResponse().GetHeaders(), headers) {
		t.Fatalf("gRPC read: headers %q, want exactly %q", got.GetResponse().GetHeaders(), headers)
	}
}

// TestCompleteRetryWithOtherHeadersIsNotOwner: a retried complete is
// answered 200 only with the same response; one that differs in a header
// alone is another response: 409 NOT_OWNER, and the stored one stays.
func TestCompleteRetryWithOtherHeadersIsNotOwner(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	h.do("POST", ns+"retry:reserve", `{"owner_token":"owner-retry-000001"}`)
	complete := func(value string) reply {
		return h.do("POST", ns+"retry:complete", fmt.Sprintf(
			`{"owner_token":"owner-retry-000001","response":{"status":201,"headers":{"X-Order":%q},"body":"b2s="}}`, value))
	}
	first := complete("42")
	if first.status != 200 {
		t.Fatalf("complete: %d %s", first.status, first)
	}
	clock.Advance(time.Second)
	if again := complete("42"); again.status != 200 || again.body["completed_at"] != first.body["completed_at"] || again.body["expires_at"] != first.body["expires_at"] {
		t.Fatalf("identical retry: %d %s, want 200 with the first answer's times %s", again.status, again, first)
	}
	if other := complete("43"); other.status != 409 || other.errCode() != "NOT_OWNER" {
		t.Fatalf("retry with another header value: %d %s, want 409 NOT_OWNER", other.status, other)
	}
	read := h.do("GET", ns+"retry", "")
	resp, _ := read.body["response"].(map[string]any)
	if hdrs, _ := resp["headers"].(map[string]any); hdrs["X-Order"] != "42" {
		t.Fatalf("stored response changed: %s", read)
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
