package server

import (
	"bytes"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/api/openapi"
	"github.com/idem-dev/idem/api/openapi/openapitest"
)

// The document's paths.
const (
	oaKey           = "/v1/namespaces/{ns}/keys/{key}"
	oaReserve       = oaKey + ":reserve"
	oaHeartbeat     = oaKey + ":heartbeat"
	oaComplete      = oaKey + ":complete"
	oaRelease       = oaKey + ":release"
	oaCheckpoint    = oaKey + ":checkpoint"
	oaForceRelease  = oaKey + ":force-release"
	oaList          = "/v1/namespaces/{ns}/keys"
	oaBatchReserve  = "/v1/namespaces/{ns}/keys:batch-reserve"
	oaBatchComplete = "/v1/namespaces/{ns}/keys:batch-complete"
	oaPolicy        = "/v1/namespaces/{ns}/policy"
)

// oaNodeOnly are operations that a server without Config.Topology (a router,
// or this test's) does not serve; cmd/idemnode's tests validate them.
var oaNodeOnly = map[string]bool{"GET /v1/topology": true, "PUT /v1/topology": true}

// TestOpenAPIDocumentDescribesTheAPI sends every operation of openapi.json,
// with its successes and its errors, to a real server on the in-memory
// backend and validates each request the server accepts and each answer
// against the document.
func TestOpenAPIDocumentDescribesTheAPI(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	v := openapitest.New(t)
	client := &http.Client{Timeout: 30 * time.Second}
	const ns = "openapi"
	do := func(method, tmpl, key, body string) openapitest.Response {
		t.Helper()
		params := map[string]string{"ns": ns}
		if strings.Contains(tmpl, "{key}") {
			params["key"] = key
		}
		return v.Do(t, client, h.httpURL, openapitest.Call{Method: method, Template: tmpl, Params: params, Body: body})
	}
	want := func(r openapitest.Response, status int, field, value string) {
		t.Helper()
		if r.Status != status {
			t.Fatalf("got %s, want %d", r, status)
		}
		if field != "" {
			got, _ := r.JSON[field].(string)
			if got != value {
				t.Fatalf("%s = %q, want %q: %s", field, got, value, r)
			}
		}
	}
	wantError := func(r openapitest.Response, status int, code Code) {
		t.Helper()
		e, _ := r.JSON["error"].(map[string]any)
		if r.Status != status || e["code"] != string(code) {
			t.Fatalf("got %s, want %d %s", r, status, code)
		}
	}

	// The document served is the committed one.
	r := v.Do(t, client, h.httpURL, openapitest.Call{Method: "GET", Template: openapi.Path})
	if r.Status != http.StatusOK || !bytes.Equal(r.Body, openapi.Document()) {
		t.Fatalf("GET /openapi.json: %d, %d bytes; want 200 and the committed document", r.Status, len(r.Body))
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		want(v.Do(t, client, h.httpURL, openapitest.Call{Method: "GET", Template: p}), http.StatusOK, "", "")
	}
	wantError(v.Do(t, client, h.httpURL, openapitest.Call{Method: "POST", Template: openapi.Path}), http.StatusMethodNotAllowed, CodeMethodNotAllowed)

	// A key's life: ACQUIRED, IN_PROGRESS, FINGERPRINT_MISMATCH, heartbeat,
	// checkpoint, complete, COMPLETED, GET.
	owner1, owner2 := "owner-token-00001", "owner-token-00002"
	want(do("POST", oaReserve, "k1", `{"fingerprint":"f1","lease_ms":1000,"owner_token":"`+owner1+`"}`), 200, "outcome", "ACQUIRED")
	want(do("POST", oaReserve, "k1", `{"fingerprint":"f1"}`), 200, "outcome", "IN_PROGRESS")
	want(do("POST", oaReserve, "k1", `{"fingerprint":"other"}`), 200, "outcome", "FINGERPRINT_MISMATCH")
	want(do("GET", oaKey, "k1", ""), 200, "state", "IN_PROGRESS")
	want(do("POST", oaHeartbeat, "k1", `{"owner_token":"`+owner1+`","lease_ms":2000}`), 200, "", "")
	wantError(do("POST", oaHeartbeat, "k1", `{"owner_token":"`+owner2+`"}`), 409, CodeNotOwner)
	want(do("POST", oaCheckpoint, "k1", `{"owner_token":"`+owner1+`","name":"step-1","data":"aGVsbG8="}`), 200, "", "")
	wantError(do("POST", oaCheckpoint, "k1", `{"owner_token":"`+owner2+`","name":"step-1"}`), 409, CodeNotOwner)
	complete := `{"owner_token":"` + owner1 + `","response":{"status":201,"headers":{"Content-Type":"text/plain"},"body":"ZG9uZQ=="},"retention_s":3600}`
	want(do("POST", oaComplete, "k1", complete), 200, "", "")
	want(do("POST", oaComplete, "k1", complete), 200, "", "")
	want(do("POST", oaReserve, "k1", `{"fingerprint":"f1"}`), 200, "outcome", "COMPLETED")
	want(do("GET", oaKey, "k1", ""), 200, "state", "COMPLETED")
	wantError(do("POST", oaRelease, "k1", `{"owner_token":"`+owner1+`"}`), 409, CodeNotOwner)

	// RECLAIMED after the lease and the skew margin, then release.
	want(do("POST", oaReserve, "k2", `{"lease_ms":100,"owner_token":"`+owner1+`"}`), 200, "outcome", "ACQUIRED")
	want(do("POST", oaCheckpoint, "k2", `{"owner_token":"`+owner1+`","name":"step-1","data":"aGVsbG8="}`), 200, "", "")
	clock.Advance(2 * time.Second)
	r = do("POST", oaReserve, "k2", `{"owner_token":"`+owner2+`"}`)
	if want(r, 200, "outcome", "RECLAIMED"); r.JSON["checkpoint"] == nil {
		t.Fatalf("RECLAIMED without the checkpoint: %s", r)
	}
	want(do("GET", oaKey, "k2", ""), 200, "state", "IN_PROGRESS")
	want(do("POST", oaRelease, "k2", `{"owner_token":"`+owner2+`"}`), 200, "", "")
	wantError(do("GET", oaKey, "k2", ""), 404, CodeNotFound)

	// Operator actions and the listing.
	want(do("POST", oaReserve, "k3", `{}`), 200, "outcome", "ACQUIRED")
	r = v.Do(t, client, h.httpURL, openapitest.Call{Method: "GET", Template: oaList, Params: map[string]string{"ns": ns},
		Query: url.Values{"state": {"IN_PROGRESS"}, "limit": {"1"}}})
	want(r, 200, "", "")
	if keys, _ := r.JSON["keys"].([]any); len(keys) != 1 {
		t.Fatalf("list with limit 1: %s", r)
	}
	want(v.Do(t, client, h.httpURL, openapitest.Call{Method: "GET", Template: oaList, Params: map[string]string{"ns": ns}}), 200, "", "")
	wantError(v.Do(t, client, h.httpURL, openapitest.Call{Method: "GET", Template: oaList, Params: map[string]string{"ns": ns},
		Query: url.Values{"limit": {"100000"}}}), 400, CodeInvalidArgument)
	want(do("POST", oaForceRelease, "k3", `{"reason":"stuck worker"}`), 200, "", "")
	wantError(do("POST", oaForceRelease, "k1", `{"reason":"completed"}`), 409, CodeFailedPrecondition)
	wantError(do("POST", oaForceRelease, "absent", `{}`), 404, CodeNotFound)
	want(do("DELETE", oaKey, "k1", `{"reason":"cleanup"}`), 200, "", "")
	wantError(do("DELETE", oaKey, "k1", `{"reason":"cleanup"}`), 404, CodeNotFound)

	// Batch calls: results in item order, one bad item fails alone.
	r = do("POST", oaBatchReserve, "", `{"items":[{"key":"b1","owner_token":"`+owner1+`"},{"key":"b2","fingerprint":"f"},{"key":"b3","lease_ms":5}]}`)
	want(r, 200, "", "")
	if res, _ := r.JSON["results"].([]any); len(res) != 3 {
		t.Fatalf("batch-reserve: %s", r)
	}
	r = do("POST", oaBatchComplete, "", `{"items":[{"key":"b1","owner_token":"`+owner1+`","response":{"status":200,"body":""}},{"key":"b2","owner_token":"`+owner2+`","response":{"status":200}}]}`)
	want(r, 200, "", "")
	wantError(do("POST", oaBatchReserve, "", `{"items":[]}`), 400, CodeInvalidArgument)
	wantError(do("GET", oaBatchReserve, "", ""), 405, CodeMethodNotAllowed)

	// Namespace policies (v1.2) and what a tombstone answers.
	want(do("PUT", oaPolicy, "", `{"max_lease_ms":60000,"tombstone_s":3600}`), 200, "", "")
	want(do("GET", oaPolicy, "", ""), 200, "", "")
	wantError(do("PUT", oaPolicy, "", `{"max_lease_ms":1}`), 400, CodeInvalidArgument)
	wantError(do("POST", oaReserve, "k5", `{"lease_ms":60001}`), 400, CodeInvalidArgument)
	want(do("POST", oaReserve, "k5", `{"owner_token":"`+owner1+`"}`), 200, "outcome", "ACQUIRED")
	want(do("POST", oaComplete, "k5", `{"owner_token":"`+owner1+`","response":{"status":200},"retention_s":1}`), 200, "", "")
	clock.Advance(2 * time.Second)
	want(do("GET", oaKey, "k5", ""), 200, "state", "EXPIRED")
	want(do("POST", oaReserve, "k5", `{}`), 200, "outcome", "EXPIRED")
	want(do("POST", oaReserve, "k5", `{"if_expired":"acquire"}`), 200, "outcome", "ACQUIRED")

	// Bad requests: each a documented error.
	wantError(do("POST", oaReserve, "k6", `{"fingerprint":`), 400, CodeInvalidArgument)
	wantError(do("POST", oaReserve, "k6", `{"unknown":1}`), 400, CodeInvalidArgument)
	wantError(do("POST", oaReserve, "k6", `{"lease_ms":5}`), 400, CodeInvalidArgument)
	wantError(do("POST", oaHeartbeat, "k6", `{"owner_token":"short"}`), 400, CodeInvalidArgument)
	wantError(do("POST", oaComplete, "k6", `{"owner_token":"`+owner1+`","response":{"status":200,"body":"`+strings.Repeat("A", 2<<20)+`"}}`), 413, CodePayloadTooLarge)
	wantError(do("PUT", oaKey, "k6", `{}`), 405, CodeMethodNotAllowed)
	wantError(do("GET", oaKey, "k6", ""), 404, CodeNotFound)
	wantError(do("POST", oaReserve, "", `{}`), 404, CodeNotFound)
	wantError(v.Do(t, client, h.httpURL, openapitest.Call{Method: "GET", Template: oaKey, Params: map[string]string{"ns": "Bad_NS", "key": "k"}}), 400, CodeInvalidArgument)

	// 503 with Retry-After and 500, from failing backends.
	down := newHarness(t, &errBackend{err: &UnavailableError{Reason: "no leader", RetryAfter: 2 * time.Second}}, nil)
	r = v.Do(t, client, down.httpURL, openapitest.Call{Method: "POST", Template: oaReserve, Params: map[string]string{"ns": ns, "key": "k"}, Body: `{}`})
	wantError(r, 503, CodeUnavailable)
	if r.Header.Get("Retry-After") == "" {
		t.Fatalf("503 without Retry-After: %v", r.Header)
	}
	wantError(v.Do(t, client, down.httpURL, openapitest.Call{Method: "GET", Template: "/readyz"}), 503, CodeUnavailable)
	broken := newHarness(t, &errBackend{panics: true}, nil)
	wantError(v.Do(t, client, broken.httpURL, openapitest.Call{Method: "GET", Template: oaKey, Params: map[string]string{"ns": ns, "key": "k"}}), 500, CodeInternal)

	// Every operation was sent, and every one this server serves answered
	// 2xx at least once.
	for _, op := range v.Operations() {
		if oaNodeOnly[op] {
			continue
		}
		st := v.Statuses(op)
		switch {
		case len(st) == 0:
			t.Errorf("%s: never sent: add it to this test", op)
		case !slices.ContainsFunc(st, func(s int) bool { return s >= 200 && s < 300 }):
			t.Errorf("%s: never answered 2xx (got %v)", op, st)
		}
	}
}

// TestOpenAPIErrorCodes: the document's error codes are the API's.
func TestOpenAPIErrorCodes(t *testing.T) {
	v := openapitest.New(t)
	var inDoc []string
	for _, c := range v.Doc.Components.Schemas["ErrorCode"].Value.Enum {
		inDoc = append(inDoc, c.(string))
	}
	codes := []Code{CodeInvalidArgument, CodeUnauthenticated, CodePermissionDenied, CodeNotFound, CodeMethodNotAllowed,
		CodeNotOwner, CodeFailedPrecondition, CodePayloadTooLarge, CodeResourceExhausted, CodeInternal, CodeUnavailable}
	var api []string
	for _, c := range codes {
		api = append(api, string(c))
	}
	for _, c := range inDoc {
		if !Code(c).Known() {
			t.Errorf("openapi.json names error code %s, which the API does not have", c)
		}
	}
	slices.Sort(inDoc)
	slices.Sort(api)
	if !slices.Equal(inDoc, api) {
		t.Errorf("error codes: openapi.json %v, the API %v", inDoc, api)
	}
}
