package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/backend"
)

const ns = "/v1/namespaces/payments/keys/"

// TestHTTPReserveOutcomes walks one key through every reserve outcome and
// checks each answer's exact fields.
func TestHTTPReserveOutcomes(t *testing.T) {
	clock := newFakeClock()
	b := newMemBackend(clock)
	h := newHarness(t, b, nil)
	start := clock.Now()

	// ACQUIRED, with a generated owner token and default lease.
	r := h.do("POST", ns+"order-1:reserve", `{"fingerprint":"fp1"}`)
	if r.status != 200 || r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("first reserve: %d %s", r.status, r)
	}
	if got, want := keys(r.body), []string{"fencing_token", "lease_expires_at", "outcome", "owner_token"}; !slices.Equal(got, want) {
		t.Fatalf("ACQUIRED fields %v, want %v", got, want)
	}
	owner1 := str(t, r.body, "owner_token")
	if len(owner1) != 22 || strings.Trim(owner1, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") != "" {
		t.Fatalf("generated owner token %q is not 22 base64url characters", owner1)
	}
	fence1 := str(t, r.body, "fencing_token")
	if _, err := strconv.ParseUint(fence1, 10, 64); err != nil {
		t.Fatalf("fencing_token %q is not a decimal string", fence1)
	}
	if got, want := str(t, r.body, "lease_expires_at"), rfc3339(start+int64(30*time.Second)); got != want {
		t.Fatalf("lease_expires_at %q, want %q (default lease 30 s)", got, want)
	}
	if !strings.HasSuffix(str(t, r.body, "lease_expires_at"), "Z") || !strings.Contains(str(t, r.body, "lease_expires_at"), ".5Z") {
		t.Fatalf("lease_expires_at %q is not RFC 3339 UTC with its fraction", r.body["lease_expires_at"])
	}
	if c := b.LastCommand(); c.Lease != int64(30*time.Second) || c.OwnerToken != owner1 {
		t.Fatalf("command lease %d owner %q, want 30 s and the returned token", c.Lease, c.OwnerToken)
	}

	// The same owner again: ACQUIRED, same fencing token, renewed lease.
	clock.Advance(time.Second)
	r = h.do("POST", ns+"order-1:reserve", fmt.Sprintf(`{"fingerprint":"fp1","owner_token":%q,"lease_ms":5000}`, owner1))
	if r.body["outcome"] != "ACQUIRED" || r.body["fencing_token"] != fence1 || r.body["owner_token"] != owner1 {
		t.Fatalf("repeat by owner: %s", r)
	}
	if got, want := r.body["lease_expires_at"], rfc3339(clock.Now()+int64(5*time.Second)); got != want {
		t.Fatalf("renewed lease_expires_at %v, want %v", got, want)
	}

	// Another owner: IN_PROGRESS.
	r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"fp1","owner_token":"other-owner-token-0001"}`)
	if r.status != 200 || r.body["outcome"] != "IN_PROGRESS" {
		t.Fatalf("other owner: %d %s", r.status, r)
	}
	if got, want := keys(r.body), []string{"lease_expires_at", "outcome", "retry_after_ms"}; !slices.Equal(got, want) {
		t.Fatalf("IN_PROGRESS fields %v, want %v", got, want)
	}
	retry, ok := r.body["retry_after_ms"].(json.Number)
	if !ok || retry.String() != "1000" {
		t.Fatalf("retry_after_ms %v (%T), want the number 1000 (the store's cap)", r.body["retry_after_ms"], r.body["retry_after_ms"])
	}

	// Another fingerprint: FINGERPRINT_MISMATCH, no other fields.
	r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"fp2"}`)
	if r.status != 200 || r.body["outcome"] != "FINGERPRINT_MISMATCH" || len(r.body) != 1 {
		t.Fatalf("fingerprint mismatch: %d %s", r.status, r)
	}
	// Empty fingerprint equals only empty.
	r = h.do("POST", ns+"order-1:reserve", ``)
	if r.body["outcome"] != "FINGERPRINT_MISMATCH" {
		t.Fatalf("empty fingerprint against fp1: %s", r)
	}

	// Past the lease plus the 1 s skew margin: RECLAIMED.
	clock.Advance(5*time.Second + time.Second)
	r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"fp1","owner_token":"second-owner-token-0002","lease_ms":100}`)
	if r.status != 200 || r.body["outcome"] != "RECLAIMED" {
		t.Fatalf("reclaim: %d %s", r.status, r)
	}
	if got, want := keys(r.body), []string{"fencing_token", "lease_expires_at", "outcome", "owner_token", "previous_fencing_token"}; !slices.Equal(got, want) {
		t.Fatalf("RECLAIMED fields %v, want %v", got, want)
	}
	if r.body["previous_fencing_token"] != fence1 || r.body["owner_token"] != "second-owner-token-0002" {
		t.Fatalf("RECLAIMED previous %v owner %v", r.body["previous_fencing_token"], r.body["owner_token"])
	}
	fence2 := str(t, r.body, "fencing_token")
	if mustUint(t, fence2) <= mustUint(t, fence1) {
		t.Fatalf("fencing token %s not above %s", fence2, fence1)
	}
	if c := b.LastCommand(); c.Lease != int64(100*time.Millisecond) {
		t.Fatalf("lease_ms 100 became %d ns", c.Lease)
	}

	// Complete, then COMPLETED replays.
	body := []byte("{\"id\":42}\x00\xff")
	r = h.do("POST", ns+"order-1:complete", fmt.Sprintf(
		`{"owner_token":"second-owner-token-0002","response":{"status":201,"headers":{"Content-Type":"application/json","X-Trace":"a, b"},"body":%q},"retention_s":60}`,
		base64.StdEncoding.EncodeToString(body)))
	if r.status != 200 {
		t.Fatalf("complete: %d %s", r.status, r)
	}
	completedAt, expiresAt := clock.Now(), clock.Now()+int64(60*time.Second)
	r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"fp1"}`)
	if r.status != 200 || r.body["outcome"] != "COMPLETED" {
		t.Fatalf("reserve after complete: %d %s", r.status, r)
	}
	if got, want := keys(r.body), []string{"completed_at", "expires_at", "fencing_token", "outcome", "response"}; !slices.Equal(got, want) {
		t.Fatalf("COMPLETED fields %v, want %v", got, want)
	}
	if r.body["fencing_token"] != fence2 || r.body["completed_at"] != rfc3339(completedAt) || r.body["expires_at"] != rfc3339(expiresAt) {
		t.Fatalf("COMPLETED tokens/times: %s", r)
	}
	checkStoredResponse(t, r.body["response"], 201, map[string]any{"Content-Type": "application/json", "X-Trace": "a, b"}, body)

	// The completing owner repeating its reserve also gets COMPLETED.
	r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"fp1","owner_token":"second-owner-token-0002"}`)
	if r.body["outcome"] != "COMPLETED" {
		t.Fatalf("completing owner's repeat: %s", r)
	}

	// Past retention a tombstone answers EXPIRED: the work was done and its
	// response is gone. Another fingerprint is still a mismatch.
	clock.Advance(61 * time.Second)
	r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"fp1"}`)
	if got, want := keys(r.body), []string{"completed_at", "expired_at", "fencing_token", "outcome"}; r.status != 200 || r.body["outcome"] != "EXPIRED" || !slices.Equal(got, want) {
		t.Fatalf("reserve past retention: %d %s", r.status, r)
	}
	if r.body["fencing_token"] != fence2 || r.body["completed_at"] != rfc3339(completedAt) || r.body["expired_at"] != rfc3339(expiresAt) {
		t.Fatalf("EXPIRED tokens/times: %s", r)
	}
	if r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"new"}`); r.body["outcome"] != "FINGERPRINT_MISMATCH" {
		t.Fatalf("tombstone with another fingerprint: %s", r)
	}
	// Past the tombstone (seven days by default) the key is unknown again.
	clock.Advance(7 * 24 * time.Hour)
	r = h.do("POST", ns+"order-1:reserve", `{"fingerprint":"new"}`)
	if r.body["outcome"] != "ACQUIRED" || mustUint(t, str(t, r.body, "fencing_token")) <= mustUint(t, fence2) {
		t.Fatalf("reserve past the tombstone: %s", r)
	}
}

func mustUint(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not a decimal uint64", s)
	}
	return n
}

func checkStoredResponse(t *testing.T, v any, status int, headers map[string]any, body []byte) {
	t.Helper()
	resp, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("response is %T, want an object", v)
	}
	if got := keys(resp); !slices.Equal(got, []string{"body", "headers", "status"}) {
		t.Fatalf("response fields %v", got)
	}
	if resp["status"] != json.Number(strconv.Itoa(status)) {
		t.Fatalf("response.status %v, want %d", resp["status"], status)
	}
	if fmt.Sprint(resp["headers"]) != fmt.Sprint(headers) {
		t.Fatalf("response.headers %v, want %v", resp["headers"], headers)
	}
	if want := base64.StdEncoding.EncodeToString(body); resp["body"] != want {
		t.Fatalf("response.body %v, want padded standard base64 %q", resp["body"], want)
	}
}

// TestHTTPHeartbeatCompleteReleaseGet covers the other endpoints' successes
// and NOT_OWNER answers, and what GET shows.
func TestHTTPHeartbeatCompleteReleaseGet(t *testing.T) {
	clock := newFakeClock()
	b := newMemBackend(clock)
	h := newHarness(t, b, nil)
	const owner = "owner-token-aaaaaaaa"
	const stranger = "stranger-token-bbbbbb"

	// Every owner-bound verb on a key that does not exist: 409.
	for _, verb := range []string{"heartbeat", "complete", "release"} {
		body := fmt.Sprintf(`{"owner_token":%q}`, owner)
		if verb == "complete" {
			body = fmt.Sprintf(`{"owner_token":%q,"response":{"status":200}}`, owner)
		}
		h.expectError(h.do("POST", ns+"nothing:"+verb, body), 409, CodeNotOwner)
	}
	// GET of an absent key: 404.
	h.expectError(h.do("GET", ns+"nothing", ""), 404, CodeNotFound)

	r := h.do("POST", ns+"k1:reserve", fmt.Sprintf(`{"owner_token":%q,"fingerprint":"f","lease_ms":1000}`, owner))
	fence := str(t, r.body, "fencing_token")

	// GET while in progress: never the owner token.
	r = h.do("GET", ns+"k1", "")
	if r.status != 200 {
		t.Fatalf("GET: %d %s", r.status, r)
	}
	if got, want := keys(r.body), []string{"fencing_token", "fingerprint", "lease_expires_at", "state"}; !slices.Equal(got, want) {
		t.Fatalf("GET IN_PROGRESS fields %v, want %v", got, want)
	}
	if r.body["state"] != "IN_PROGRESS" || r.body["fingerprint"] != "f" || r.body["fencing_token"] != fence ||
		r.body["lease_expires_at"] != rfc3339(clock.Now()+int64(time.Second)) {
		t.Fatalf("GET IN_PROGRESS: %s", r)
	}
	if strings.Contains(r.String(), owner) {
		t.Fatalf("GET shows the owner token: %s", r)
	}
	// HEAD answers like GET, without a body.
	if r := h.do("HEAD", ns+"k1", ""); r.status != 200 || len(r.raw) != 0 {
		t.Fatalf("HEAD: %d %q", r.status, r.raw)
	}

	// Heartbeat: default lease 30 s, even after the lease ran out.
	clock.Advance(1500 * time.Millisecond)
	r = h.do("POST", ns+"k1:heartbeat", fmt.Sprintf(`{"owner_token":%q}`, owner))
	if r.status != 200 || len(r.body) != 1 || r.body["lease_expires_at"] != rfc3339(clock.Now()+int64(30*time.Second)) {
		t.Fatalf("heartbeat: %d %s", r.status, r)
	}
	r = h.do("POST", ns+"k1:heartbeat", fmt.Sprintf(`{"owner_token":%q,"lease_ms":600000}`, owner))
	if r.body["lease_expires_at"] != rfc3339(clock.Now()+int64(600*time.Second)) {
		t.Fatalf("heartbeat lease_ms 600000: %s", r)
	}
	h.expectError(h.do("POST", ns+"k1:heartbeat", fmt.Sprintf(`{"owner_token":%q}`, stranger)), 409, CodeNotOwner)
	h.expectError(h.do("POST", ns+"k1:release", fmt.Sprintf(`{"owner_token":%q}`, stranger)), 409, CodeNotOwner)
	h.expectError(h.do("POST", ns+"k1:complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":200}}`, stranger)), 409, CodeNotOwner)

	// Complete with default retention and no headers or body.
	r = h.do("POST", ns+"k1:complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":204}}`, owner))
	if r.status != 200 || len(r.body) != 2 {
		t.Fatalf("complete: %d %s", r.status, r)
	}
	if r.body["completed_at"] != rfc3339(clock.Now()) || r.body["expires_at"] != rfc3339(clock.Now()+int64(86400*time.Second)) {
		t.Fatalf("complete times (default retention 86400 s): %s", r)
	}
	first := r.String()
	// A retried complete (same response; retention ignored) answers the same.
	clock.Advance(time.Second)
	r = h.do("POST", ns+"k1:complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":204},"retention_s":5}`, owner))
	if r.status != 200 || r.String() != first {
		t.Fatalf("retried complete: %d %s, want %s", r.status, r, first)
	}
	// A different response: 409. Heartbeat and release of a completed key: 409.
	h.expectError(h.do("POST", ns+"k1:complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":200}}`, owner)), 409, CodeNotOwner)
	h.expectError(h.do("POST", ns+"k1:heartbeat", fmt.Sprintf(`{"owner_token":%q}`, owner)), 409, CodeNotOwner)
	h.expectError(h.do("POST", ns+"k1:release", fmt.Sprintf(`{"owner_token":%q}`, owner)), 409, CodeNotOwner)

	// GET of a completed key.
	r = h.do("GET", ns+"k1", "")
	if got, want := keys(r.body), []string{"completed_at", "expires_at", "fencing_token", "fingerprint", "response", "state"}; !slices.Equal(got, want) {
		t.Fatalf("GET COMPLETED fields %v, want %v", got, want)
	}
	if r.body["state"] != "COMPLETED" || r.body["fencing_token"] != fence || strings.Contains(r.String(), owner) {
		t.Fatalf("GET COMPLETED: %s", r)
	}
	checkStoredResponse(t, r.body["response"], 204, map[string]any{}, nil)

	// Release frees the key; the next reserve acquires with a larger token.
	r = h.do("POST", ns+"k2:reserve", fmt.Sprintf(`{"owner_token":%q}`, owner))
	fence2 := str(t, r.body, "fencing_token")
	r = h.do("POST", ns+"k2:release", fmt.Sprintf(`{"owner_token":%q}`, owner))
	if r.status != 200 || r.String() != "{}\n" {
		t.Fatalf("release: %d %q", r.status, r.raw)
	}
	h.expectError(h.do("GET", ns+"k2", ""), 404, CodeNotFound)
	r = h.do("POST", ns+"k2:reserve", `{}`)
	if r.body["outcome"] != "ACQUIRED" || mustUint(t, str(t, r.body, "fencing_token")) <= mustUint(t, fence2) {
		t.Fatalf("reserve after release: %s", r)
	}
}

// TestHTTPPaths covers routing from the raw path.
func TestHTTPPaths(t *testing.T) {
	clock := newFakeClock()
	b := newMemBackend(clock)
	h := newHarness(t, b, nil)

	// A key with ':' and '/' encoded; the verb follows the last ':'.
	r := h.do("POST", "/v1/namespaces/payments/keys/a%3Ab%2Fc%25d%3Freserve:reserve", "")
	if r.status != 200 || r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("encoded key: %d %s", r.status, r)
	}
	if c := b.LastCommand(); c.Key != "a:b/c%d?reserve" || c.Namespace != "payments" {
		t.Fatalf("decoded namespace %q key %q", c.Namespace, c.Key)
	}
	r = h.do("GET", "/v1/namespaces/payments/keys/a%3Ab%2Fc%25d%3Freserve", "")
	if r.status != 200 {
		t.Fatalf("GET of encoded key: %d %s", r.status, r)
	}
	// An unencoded ':' in the key: the verb is still after the last ':'.
	r = h.do("POST", "/v1/namespaces/payments/keys/x:y:reserve", "")
	if r.status != 200 || b.LastCommand().Key != "x:y" {
		t.Fatalf("raw ':' in key: %d %s key %q", r.status, r, b.LastCommand().Key)
	}
	// GET has no verb: "x:y" is read back; "x:y:reserve" is another key.
	if r := h.do("GET", "/v1/namespaces/payments/keys/x:y", ""); r.status != 200 {
		t.Fatalf("GET x:y: %d %s", r.status, r)
	}
	h.expectError(h.do("GET", "/v1/namespaces/payments/keys/x:y:reserve", ""), 404, CodeNotFound)
	// An encoded namespace is decoded.
	if r := h.do("POST", "/v1/namespaces/p%61yments/keys/enc-ns:reserve", ""); r.status != 200 || b.LastCommand().Namespace != "payments" {
		t.Fatalf("encoded namespace: %d %s", r.status, r)
	}
	// The longest key and namespace are fine.
	long := strings.Repeat("k", 255)
	if r := h.do("POST", "/v1/namespaces/"+strings.Repeat("n", 63)+"/keys/"+long+":reserve", ""); r.status != 200 {
		t.Fatalf("255-byte key, 63-byte namespace: %d %s", r.status, r)
	}
	if r := h.do("POST", "/v1/namespaces/a.b_c-d/keys/!~:reserve", ""); r.status != 200 {
		t.Fatalf("namespace a.b_c-d, key !~: %d %s", r.status, r)
	}

	cases := []struct {
		name, method, path string
		status             int
		code               Code
		allow              string
	}{
		{"unknown verb", "POST", ns + "k:frobnicate", 404, CodeNotFound, ""},
		{"verb case", "POST", ns + "k:Reserve", 404, CodeNotFound, ""},
		{"encoded colon hides verb", "POST", ns + "k%3Areserve", 405, CodeMethodNotAllowed, "GET, HEAD, DELETE"},
		{"empty key POST", "POST", ns + ":reserve", 404, CodeNotFound, ""},
		{"empty key GET", "GET", ns, 404, CodeNotFound, ""},
		{"no keys segment", "GET", "/v1/namespaces/payments", 404, CodeNotFound, ""},
		{"other collection", "GET", "/v1/namespaces/payments/locks/k", 404, CodeNotFound, ""},
		{"unencoded slash", "GET", ns + "a/b", 404, CodeNotFound, ""},
		{"unknown root", "GET", "/v2/namespaces/payments/keys/k", 404, CodeNotFound, ""},
		{"unknown v1 path", "GET", "/v1/keys", 404, CodeNotFound, ""},
		{"root", "GET", "/", 404, CodeNotFound, ""},
		{"PUT on key", "PUT", ns + "k", 405, CodeMethodNotAllowed, "GET, HEAD, DELETE"},
		{"DELETE of an absent key (v1.1)", "DELETE", ns + "k", 404, CodeNotFound, ""},
		{"PUT on verb", "PUT", ns + "k:reserve", 405, CodeMethodNotAllowed, "POST"},
		{"POST without verb", "POST", ns + "k", 405, CodeMethodNotAllowed, "GET, HEAD, DELETE"},
		{"POST healthz", "POST", "/healthz", 405, CodeMethodNotAllowed, "GET, HEAD"},
		{"uppercase namespace", "POST", "/v1/namespaces/Payments/keys/k:reserve", 400, CodeInvalidArgument, ""},
		{"namespace starts with dot", "GET", "/v1/namespaces/.ns/keys/k", 400, CodeInvalidArgument, ""},
		{"namespace too long", "GET", "/v1/namespaces/" + strings.Repeat("n", 64) + "/keys/k", 400, CodeInvalidArgument, ""},
		{"empty namespace", "GET", "/v1/namespaces//keys/k", 400, CodeInvalidArgument, ""},
		{"namespace with encoded slash", "GET", "/v1/namespaces/a%2Fb/keys/k", 400, CodeInvalidArgument, ""},
		{"key with space", "POST", ns + "a%20b:reserve", 400, CodeInvalidArgument, ""},
		{"key with DEL", "GET", ns + "a%7Fb", 400, CodeInvalidArgument, ""},
		{"key with NUL", "GET", ns + "a%00b", 400, CodeInvalidArgument, ""},
		{"key with UTF-8", "POST", ns + "caf%C3%A9:reserve", 400, CodeInvalidArgument, ""},
		{"key too long", "POST", ns + strings.Repeat("k", 256) + ":reserve", 400, CodeInvalidArgument, ""},
		{"key too long encoded", "GET", ns + strings.Repeat("%41", 256), 400, CodeInvalidArgument, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			r := h.do(c.method, c.path, "")
			h.expectError(r, c.status, c.code)
			if got := r.header.Get("Allow"); got != c.allow {
				t.Fatalf("Allow %q, want %q", got, c.allow)
			}
			h.expectServing()
		})
	}
}

// TestHTTPBadBodies: every malformed body gets a 4xx with the error body, and
// the server keeps serving.
func TestHTTPBadBodies(t *testing.T) {
	clock := newFakeClock()
	b := newMemBackend(clock)
	h := newHarness(t, b, func(c *Config) { c.MaxResponseBytes = 1000 })
	const owner = "owner-token-aaaaaaaa"
	// A key owned by owner, so that a complete that passed validation would succeed.
	if r := h.do("POST", ns+"k:reserve", fmt.Sprintf(`{"owner_token":%q}`, owner)); r.body["outcome"] != "ACQUIRED" {
		t.Fatalf("setup: %s", r)
	}
	complete := func(response string) string {
		return fmt.Sprintf(`{"owner_token":%q,"response":%s}`, owner, response)
	}
	manyHeaders := func(n, valueLen int) string {
		var parts []string
		for i := range n {
			parts = append(parts, fmt.Sprintf(`"H%d":%q`, i, strings.Repeat("v", valueLen)))
		}
		return complete(`{"status":200,"headers":{` + strings.Join(parts, ",") + `}}`)
	}
	cases := []struct {
		name, verb, body string
		status           int
		code             Code
		msg              string // a fragment the message must contain
	}{
		{"malformed JSON", "reserve", `{`, 400, CodeInvalidArgument, "not valid JSON"},
		{"malformed JSON value", "reserve", `{"lease_ms":}`, 400, CodeInvalidArgument, "not valid JSON"},
		{"array", "reserve", `[]`, 400, CodeInvalidArgument, "JSON object"},
		{"string", "reserve", `"x"`, 400, CodeInvalidArgument, "JSON object"},
		{"null", "reserve", `null`, 400, CodeInvalidArgument, "JSON object"},
		{"two values", "reserve", `{}{}`, 400, CodeInvalidArgument, "exactly one"},
		{"trailing garbage", "reserve", `{} x`, 400, CodeInvalidArgument, "exactly one"},
		{"unknown field", "reserve", `{"fingerprint":"a","foo":1}`, 400, CodeInvalidArgument, `"foo"`},
		{"field name case", "reserve", `{"Lease_ms":1000}`, 400, CodeInvalidArgument, `"Lease_ms"`},
		{"fingerprint too long", "reserve", fmt.Sprintf(`{"fingerprint":%q}`, strings.Repeat("é", 257)), 400, CodeInvalidArgument, "fingerprint"},
		{"fingerprint number", "reserve", `{"fingerprint":5}`, 400, CodeInvalidArgument, "fingerprint must be a JSON string"},
		{"lease too short", "reserve", `{"lease_ms":99}`, 400, CodeInvalidArgument, "lease_ms 99"},
		{"lease too long", "reserve", `{"lease_ms":600001}`, 400, CodeInvalidArgument, "lease_ms 600001"},
		{"lease negative", "reserve", `{"lease_ms":-1}`, 400, CodeInvalidArgument, "lease_ms -1"},
		{"lease fraction", "reserve", `{"lease_ms":1000.5}`, 400, CodeInvalidArgument, "whole number"},
		{"lease string", "reserve", `{"lease_ms":"1000"}`, 400, CodeInvalidArgument, "must be a JSON number"},
		{"lease bool", "reserve", `{"lease_ms":true}`, 400, CodeInvalidArgument, "must be a JSON number"},
		{"lease huge", "reserve", `{"lease_ms":9223372036854775808}`, 400, CodeInvalidArgument, "out of range"},
		{"lease overflow", "reserve", `{"lease_ms":1e400}`, 400, CodeInvalidArgument, "out of range"},
		{"owner token short", "reserve", `{"owner_token":"123456789012345"}`, 400, CodeInvalidArgument, "owner_token"},
		{"owner token long", "reserve", fmt.Sprintf(`{"owner_token":%q}`, strings.Repeat("a", 129)), 400, CodeInvalidArgument, "owner_token"},
		{"owner token bad char", "reserve", `{"owner_token":"abcdefghijklmnop!"}`, 400, CodeInvalidArgument, "owner_token"},
		{"several problems at once", "reserve", `{"lease_ms":1,"owner_token":"x"}`, 400, CodeInvalidArgument, "lease_ms 1"},

		{"heartbeat empty body", "heartbeat", ``, 400, CodeInvalidArgument, "owner_token is required"},
		{"heartbeat no token", "heartbeat", `{"lease_ms":1000}`, 400, CodeInvalidArgument, "owner_token is required"},
		{"heartbeat empty token", "heartbeat", `{"owner_token":""}`, 400, CodeInvalidArgument, "owner_token is required"},
		{"heartbeat bad token", "heartbeat", `{"owner_token":"short"}`, 400, CodeInvalidArgument, "owner_token"},
		{"heartbeat lease", "heartbeat", fmt.Sprintf(`{"owner_token":%q,"lease_ms":50}`, owner), 400, CodeInvalidArgument, "lease_ms 50"},
		{"heartbeat unknown field", "heartbeat", fmt.Sprintf(`{"owner_token":%q,"fingerprint":"x"}`, owner), 400, CodeInvalidArgument, `"fingerprint"`},

		{"release empty body", "release", ``, 400, CodeInvalidArgument, "owner_token is required"},
		{"release bad token", "release", `{"owner_token":"abc def ghi jkl mno"}`, 400, CodeInvalidArgument, "owner_token"},
		{"release unknown field", "release", fmt.Sprintf(`{"owner_token":%q,"lease_ms":100}`, owner), 400, CodeInvalidArgument, `"lease_ms"`},

		{"complete no token", "complete", `{"response":{"status":200}}`, 400, CodeInvalidArgument, "owner_token is required"},
		{"complete bad token", "complete", `{"owner_token":"bad","response":{"status":200}}`, 400, CodeInvalidArgument, "owner_token"},
		{"complete no response", "complete", fmt.Sprintf(`{"owner_token":%q}`, owner), 400, CodeInvalidArgument, "response is required"},
		{"complete response not object", "complete", complete(`"ok"`), 400, CodeInvalidArgument, "response must be a JSON object"},
		{"complete unknown nested field", "complete", complete(`{"status":200,"trailers":{}}`), 400, CodeInvalidArgument, `"trailers" in response`},
		{"complete nested field case", "complete", complete(`{"Status":200}`), 400, CodeInvalidArgument, `"Status"`},
		{"complete no status", "complete", complete(`{}`), 400, CodeInvalidArgument, "response.status 0"},
		{"complete status 99", "complete", complete(`{"status":99}`), 400, CodeInvalidArgument, "response.status 99"},
		{"complete status 600", "complete", complete(`{"status":600}`), 400, CodeInvalidArgument, "response.status 600"},
		{"complete status fraction", "complete", complete(`{"status":200.5}`), 400, CodeInvalidArgument, "response.status must be a whole number"},
		{"complete status huge", "complete", complete(`{"status":4294967496}`), 400, CodeInvalidArgument, "response.status 4294967496"},
		{"complete retention high", "complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":200},"retention_s":2592001}`, owner), 400, CodeInvalidArgument, "retention_s 2592001"},
		{"complete retention negative", "complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":200},"retention_s":-5}`, owner), 400, CodeInvalidArgument, "retention_s -5"},
		{"complete bad base64", "complete", complete(`{"status":200,"body":"!!!!"}`), 400, CodeInvalidArgument, "base64"},
		{"complete mixed alphabets", "complete", complete(`{"status":200,"body":"ab+_"}`), 400, CodeInvalidArgument, "base64"},
		{"complete bad padding", "complete", complete(`{"status":200,"body":"QQ="}`), 400, CodeInvalidArgument, "base64"},
		{"complete body not string", "complete", complete(`{"status":200,"body":[1]}`), 400, CodeInvalidArgument, "response.body must be a JSON string"},
		{"complete headers not object", "complete", complete(`{"status":200,"headers":["a"]}`), 400, CodeInvalidArgument, "response.headers must be"},
		{"complete header value number", "complete", complete(`{"status":200,"headers":{"A":1}}`), 400, CodeInvalidArgument, `response.headers["A"] must be a string`},
		{"complete header value array", "complete", complete(`{"status":200,"headers":{"A":["x","y"]}}`), 400, CodeInvalidArgument, `response.headers["A"] must be a string`},
		{"complete header name space", "complete", complete(`{"status":200,"headers":{"Bad Name":"x"}}`), 400, CodeInvalidArgument, "header name"},
		{"complete header name empty", "complete", complete(`{"status":200,"headers":{"":"x"}}`), 400, CodeInvalidArgument, "header name"},
		{"complete header name long", "complete", complete(fmt.Sprintf(`{"status":200,"headers":{%q:"x"}}`, strings.Repeat("h", 257))), 400, CodeInvalidArgument, "header name"},
		{"complete header value newline", "complete", complete(`{"status":200,"headers":{"A":"x\r\nSet-Cookie: y"}}`), 400, CodeInvalidArgument, "control"},
		{"complete header value long", "complete", complete(fmt.Sprintf(`{"status":200,"headers":{"A":%q}}`, strings.Repeat("v", 8193))), 400, CodeInvalidArgument, "8192"},
		{"complete too many headers", "complete", manyHeaders(101, 1), 400, CodeInvalidArgument, "101 entries"},
		{"complete headers too big", "complete", manyHeaders(9, 8000), 400, CodeInvalidArgument, "65536"},
		{"complete body too large", "complete", complete(fmt.Sprintf(`{"status":200,"body":%q}`, base64.StdEncoding.EncodeToString(make([]byte, 1001)))), 413, CodePayloadTooLarge, "1001 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			r := h.do("POST", ns+"k:"+c.verb, c.body)
			h.expectError(r, c.status, c.code)
			if !strings.Contains(r.errMessage(), c.msg) {
				t.Fatalf("message %q does not mention %q", r.errMessage(), c.msg)
			}
			if strings.Contains(r.errMessage(), owner) {
				t.Fatalf("message echoes the owner token: %q", r.errMessage())
			}
			h.expectServing()
		})
	}
	h.t = t
	// Nothing above changed the key: its owner still holds it.
	if r := h.do("POST", ns+"k:heartbeat", fmt.Sprintf(`{"owner_token":%q}`, owner)); r.status != 200 {
		t.Fatalf("heartbeat after the bad requests: %d %s", r.status, r)
	}
	// The boundaries themselves are accepted.
	good := []struct{ verb, body string }{
		{"reserve", fmt.Sprintf(`{"fingerprint":%q,"lease_ms":100}`, strings.Repeat("é", 256))},
		{"reserve", `{"lease_ms":600000,"owner_token":"","fingerprint":null}`},
		{"reserve", `{"lease_ms":3e4}`},
		{"reserve", `{"lease_ms":30000.0}`},
		{"reserve", fmt.Sprintf(`{"owner_token":%q}`, strings.Repeat("A", 128))},
		{"reserve", ` {"lease_ms":0} ` + "\n"},
	}
	for i, g := range good {
		if r := h.do("POST", fmt.Sprintf("%sgood-%d:%s", ns, i, g.verb), g.body); r.status != 200 || r.body["outcome"] != "ACQUIRED" {
			t.Fatalf("good %s %s: %d %s", g.verb, g.body, r.status, r)
		}
	}
	var hdrs []string
	for i := range 100 {
		hdrs = append(hdrs, fmt.Sprintf(`"H-%d":"v"`, i))
	}
	for i, resp := range []string{
		fmt.Sprintf(`{"status":100,"body":%q}`, base64.StdEncoding.EncodeToString(make([]byte, 1000))),
		`{"status":599,"headers":{` + strings.Join(hdrs, ",") + `}}`,
		fmt.Sprintf(`{"status":200,"headers":{"!#$%%&'*+-.^_|~09azAZ":%q}}`, "tab\tand UTF-8 é "+strings.Repeat("v", 8000)),
	} {
		key := fmt.Sprintf("%scomplete-%d", ns, i)
		h.do("POST", key+":reserve", fmt.Sprintf(`{"owner_token":%q}`, owner))
		if r := h.do("POST", key+":complete", complete(resp)); r.status != 200 {
			t.Fatalf("good complete %d: %d %s", i, r.status, r)
		}
	}
	if r := h.do("POST", ns+"complete-0:complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":100,"body":%q},"retention_s":2592000}`,
		owner, base64.StdEncoding.EncodeToString(make([]byte, 1000)))); r.status != 200 {
		t.Fatalf("retried complete with retention_s 2592000: %d %s", r.status, r)
	}
}

// TestHTTPOversizeRequest: a request body over MaxRequestBytes is 413, with
// or without a Content-Length, and the server keeps serving.
func TestHTTPOversizeRequest(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), func(c *Config) { c.MaxResponseBytes = 1000 })
	limit := MaxRequestBytesFor(1000)
	big := `{"fingerprint":"` + strings.Repeat("x", int(limit)) + `"}`

	h.expectError(h.do("POST", ns+"k:reserve", big), 413, CodePayloadTooLarge)
	h.expectServing()
	// Chunked: no Content-Length, so the limit trips while reading.
	h.expectError(h.doReader("POST", ns+"k:reserve", io.MultiReader(strings.NewReader(big))), 413, CodePayloadTooLarge)
	h.expectServing()
	// Just under the limit is read (and then rejected for the fingerprint).
	under := `{"fingerprint":"` + strings.Repeat("x", int(limit)-20) + `"}`
	h.expectError(h.do("POST", ns+"k:reserve", under), 400, CodeInvalidArgument)
}

// TestHTTPBodyBase64Variants: padded, unpadded and URL-safe input all decode
// to the same bytes, replayed as padded standard base64.
func TestHTTPBodyBase64Variants(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	const owner = "owner-token-aaaaaaaa"
	// Bytes whose encodings use '+', '/', '-', '_' and need padding.
	body := []byte{0xfb, 0xff, 0xbf, 0xfe, 0x0f}
	variants := map[string]string{
		"std padded":   base64.StdEncoding.EncodeToString(body),
		"std unpadded": base64.RawStdEncoding.EncodeToString(body),
		"url padded":   base64.URLEncoding.EncodeToString(body),
		"url unpadded": base64.RawURLEncoding.EncodeToString(body),
	}
	if variants["std padded"] != "+/+//g8=" || variants["url unpadded"] != "-_-__g8" {
		t.Fatalf("test bytes do not exercise the alphabets: %v", variants)
	}
	i := 0
	for name, enc := range variants {
		i++
		key := fmt.Sprintf("%sb64-%d", ns, i)
		h.do("POST", key+":reserve", fmt.Sprintf(`{"owner_token":%q}`, owner))
		r := h.do("POST", key+":complete", fmt.Sprintf(`{"owner_token":%q,"response":{"status":200,"body":%q}}`, owner, enc))
		if r.status != 200 {
			t.Fatalf("%s %q: %d %s", name, enc, r.status, r)
		}
		r = h.do("GET", key, "")
		checkStoredResponse(t, r.body["response"], 200, map[string]any{}, body)
	}
}

// TestHTTPBackendErrors maps each backend failure to its code.
func TestHTTPBackendErrors(t *testing.T) {
	cases := []struct {
		name       string
		backend    *errBackend
		status     int
		code       Code
		retryAfter string
	}{
		{"unavailable typed", &errBackend{err: &UnavailableError{RetryAfter: 2500 * time.Millisecond, Reason: "no leader for shard 3"}}, 503, CodeUnavailable, "3"},
		{"unavailable wrapped", &errBackend{err: fmt.Errorf("forward: %w", ErrUnavailable)}, 503, CodeUnavailable, "1"},
		{"deadline", &errBackend{err: fmt.Errorf("apply: %w", contextDeadline())}, 503, CodeUnavailable, "1"},
		{"api error passes", &errBackend{err: &backend.Error{Code: CodeResourceExhausted, Message: "slow down", RetryAfter: 4 * time.Second}}, 429, CodeResourceExhausted, "4"},
		{"api unauthenticated", &errBackend{err: &backend.Error{Code: CodeUnauthenticated, Message: "who are you?"}}, 401, CodeUnauthenticated, ""},
		{"internal", &errBackend{err: fmt.Errorf("bolt: page 7 corrupt at /var/lib/secret")}, 500, CodeInternal, ""},
		{"invalid outcome", &errBackend{result: resultInvalid()}, 500, CodeInternal, ""},
		{"panic", &errBackend{panics: true}, 500, CodeInternal, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, c.backend, nil)
			for _, req := range [][2]string{
				{"POST", ns + "k:reserve"},
				{"POST", ns + "k:release"},
				{"GET", ns + "k"},
			} {
				body := ""
				if req[0] == "POST" {
					body = `{"owner_token":"owner-token-aaaaaaaa"}`
				}
				if c.backend.result.Outcome != 0 && req[0] == "GET" {
					continue // Get has no outcome
				}
				r := h.do(req[0], req[1], body)
				h.expectError(r, c.status, c.code)
				if got := r.header.Get("Retry-After"); got != c.retryAfter {
					t.Fatalf("%s %s: Retry-After %q, want %q", req[0], req[1], got, c.retryAfter)
				}
				if strings.Contains(r.errMessage(), "secret") || strings.Contains(r.errMessage(), "boom") {
					t.Fatalf("message leaks internals: %q", r.errMessage())
				}
				if r := h.do("GET", "/healthz", ""); r.status != 200 {
					t.Fatalf("healthz after %s: %d", c.name, r.status)
				}
			}
			if c.code == CodeInternal && !strings.Contains(h.logs.String(), "level=ERROR") {
				t.Fatalf("an internal error was not logged")
			}
		})
	}
}

// TestHTTPProbesAndMetrics covers /healthz, /readyz and /metrics.
func TestHTTPProbesAndMetrics(t *testing.T) {
	b := newMemBackend(newFakeClock())
	h := newHarness(t, b, nil)

	r := h.do("GET", "/healthz", "")
	if r.status != 200 || r.body["version"] != "test-1.2.3" {
		t.Fatalf("healthz: %d %s", r.status, r)
	}
	if r := h.do("GET", "/readyz", ""); r.status != 200 {
		t.Fatalf("readyz: %d %s", r.status, r)
	}
	b.SetReady(fmt.Errorf("shard us-east/2 has no leader"))
	r = h.do("GET", "/readyz", "")
	h.expectError(r, 503, CodeUnavailable)
	if !strings.Contains(r.errMessage(), "shard us-east/2 has no leader") || r.header.Get("Retry-After") == "" {
		t.Fatalf("readyz not ready: %s (Retry-After %q)", r, r.header.Get("Retry-After"))
	}
	// healthz does not depend on readiness.
	if r := h.do("GET", "/healthz", ""); r.status != 200 {
		t.Fatalf("healthz while not ready: %d", r.status)
	}

	h.do("POST", ns+"m:reserve", "")
	h.do("POST", ns+"m:reserve", "")
	h.do("POST", ns+"m:frob", "")
	h.do("POST", ns+"m:heartbeat", "")
	r = h.do("GET", "/metrics", "")
	if r.status != 200 {
		t.Fatalf("metrics: %d", r.status)
	}
	text := r.String()
	for _, want := range []string{
		`idem_api_requests_total{api="http",endpoint="reserve",outcome="ACQUIRED"} 1`,
		`idem_api_requests_total{api="http",endpoint="reserve",outcome="IN_PROGRESS"} 1`,
		`idem_api_requests_total{api="http",endpoint="unknown",outcome="NOT_FOUND"} 1`,
		`idem_api_requests_total{api="http",endpoint="heartbeat",outcome="INVALID_ARGUMENT"} 1`,
		`idem_api_request_duration_seconds_count{api="http",endpoint="reserve"} 2`,
	} {
		if !strings.Contains(text, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, `"m"`) {
		t.Fatalf("a metric is labelled by key")
	}
}

// TestHTTPExtraRoutes: extra routes are served, but never shadow the API.
func TestHTTPExtraRoutes(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), func(c *Config) {
		c.ExtraRoutes = map[string]http.Handler{
			"GET /status": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "extra") }),
			"/healthz":    http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(599) }),
			"GET /panic":  http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("extra boom") }),
		}
	})
	if r := h.do("GET", "/status", ""); r.status != 200 || r.String() != "extra" {
		t.Fatalf("/status: %d %s", r.status, r)
	}
	if r := h.do("GET", "/healthz", ""); r.status != 200 {
		t.Fatalf("/healthz shadowed: %d", r.status)
	}
	h.expectError(h.do("GET", "/panic", ""), 500, CodeInternal)
	h.expectServing()

	if _, err := New(Config{Backend: &errBackend{}, ExtraRoutes: map[string]http.Handler{"BAD PATTERN x": http.NotFoundHandler()}}); err == nil {
		t.Fatalf("a malformed ExtraRoutes pattern was accepted")
	}
}
