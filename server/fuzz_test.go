package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// FuzzDecodeBodies feeds bytes to every JSON body decoder of the API: none
// panics, and a refusal is always INVALID_ARGUMENT (a 400 naming what is
// wrong), never anything that would take the process down or answer 500.
// Seeds: testdata/fuzz/FuzzDecodeBodies and the literals below.
func FuzzDecodeBodies(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"fingerprint":"sha:1","lease_ms":30000,"owner_token":"owner-0123456789abcdef","wait_ms":100}`,
		`{"owner_token":"o","response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"eyJpZCI6MX0="}}`,
		`{"owner_token":"o","lease_ms":1e3}`, `{"response":{"body":"!!"}}`, `[]`, `null`, `{"a":1}`, `{"lease_ms":-1}`,
		`{"fingerprint":"\ud800"}`, "{\"fingerprint\":\"a\"}garbage", `{"response":{"headers":{"X":["a","b"]}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(name string, e *Error) {
			if e != nil && e.Code != CodeInvalidArgument {
				t.Fatalf("%s(%q): code %s (%s), want INVALID_ARGUMENT", name, data, e.Code, e.Message)
			}
		}
		_, e := decodeReserve(data)
		check("decodeReserve", e)
		_, e = decodeHeartbeat(data)
		check("decodeHeartbeat", e)
		_, e = decodeRelease(data)
		check("decodeRelease", e)
		_, e = decodeComplete(data)
		check("decodeComplete", e)
	})
}

// FuzzParseRoute feeds raw paths to the key-path parser: it never panics,
// refuses only with NOT_FOUND, INVALID_ARGUMENT (a bad escape) or
// METHOD_NOT_ALLOWED (405 with an Allow
// header), and a path it accepts has an endpoint and a non-empty key (but
// the list of a namespace's keys, which names none). (The namespace and key
// rules are checked next by the handler; FuzzHTTPAPI covers the whole path.)
func FuzzParseRoute(f *testing.F) {
	for _, s := range []string{
		"/v1/namespaces/payments/keys/order-42", "/v1/namespaces/payments/keys/order-42:reserve",
		"/v1/namespaces/p/keys/a%3Ab:complete", "/v1/namespaces/p/keys/%2F", "/v1/namespaces/P/keys/x",
		"/v1/namespaces//keys/x", "/v1/namespaces/p/keys/", "/v1/namespaces/p/keys/x:bogus", "/v1/namespaces/p/keys/%zz",
		"/v1/namespaces/p/keys/x:force-release", "/healthz",
	} {
		f.Add("POST", s)
		f.Add("GET", s)
	}
	f.Fuzz(func(t *testing.T, method, raw string) {
		rt, e := parseRoute(method, raw)
		switch {
		case e == nil:
			if rt.endpoint == endpointUnknown || (rt.key == "" && rt.endpoint != endpointList) {
				t.Fatalf("parseRoute(%q, %q) accepted %+v", method, raw, rt)
			}
		case e.Code == CodeMethodNotAllowed:
			if rt.allow == "" {
				t.Fatalf("parseRoute(%q, %q): 405 without an Allow header", method, raw)
			}
		case e.Code != CodeNotFound && e.Code != CodeInvalidArgument:
			t.Fatalf("parseRoute(%q, %q): code %s", method, raw, e.Code)
		}
	})
}

// FuzzHTTPAPI sends a fuzzed path and body through the whole JSON API over
// the in-memory backend: the answer is never a 5xx and always a JSON body.
func FuzzHTTPAPI(f *testing.F) {
	f.Add("POST", "/v1/namespaces/p/keys/k:reserve", []byte(`{}`))
	f.Add("POST", "/v1/namespaces/p/keys/k:complete", []byte(`{"owner_token":"o","response":{"status":200}}`))
	f.Add("GET", "/v1/namespaces/p/keys/k", []byte(nil))
	f.Add("DELETE", "/v1/namespaces/p/keys/k", []byte(`{"reason":"x"}`))
	f.Add("POST", "/v1/namespaces/p/keys/k%00:heartbeat", []byte(`{"owner_token":"\u0000"}`))
	srv, err := New(Config{Backend: newMemBackend(newFakeClock())})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.HTTPHandler()
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		if len(path) == 0 || path[0] != '/' || len(method) == 0 {
			return
		}
		req, err := http.NewRequest(method, "http://idem"+path, bytes.NewReader(body))
		if err != nil {
			return // not a request a client could send
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 && w.Code != http.StatusServiceUnavailable {
			t.Fatalf("%s %q %q: %d %s", method, path, body, w.Code, w.Body)
		}
		if w.Code >= 400 && w.Body.Len() > 0 && !json.Valid(w.Body.Bytes()) {
			t.Fatalf("%s %q: %d with a body that is not JSON: %q", method, path, w.Code, w.Body)
		}
	})
}
