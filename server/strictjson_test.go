package server

import (
	"strings"
	"testing"
)

// TestHTTPRefusesWhatDecodingWouldRewrite: a body that is not UTF-8, a
// string with half a surrogate pair, or an object that names a member twice
// is 400 INVALID_ARGUMENT, never stored as something else than was sent
// (encoding/json turns the first two into U+FFFD and keeps the last of the
// third), on both decoding paths.
func TestHTTPRefusesWhatDecodingWouldRewrite(t *testing.T) {
	for _, fast := range []bool{true, false} {
		scanFast = fast
		t.Cleanup(func() { scanFast = true })
		h := newHarness(t, newMemBackend(newFakeClock()), nil)
		owner := "owner-token-00001"
		bad := []struct {
			name, path, body, want string
		}{
			{"invalid UTF-8 fingerprint", "f1:reserve", "{\"fingerprint\":\"\xff\xfe\"}", "not valid UTF-8 (byte 16)"},
			{"invalid UTF-8 in a name", "f1:reserve", "{\"\xff\":1}", "not valid UTF-8"},
			{"lone high surrogate", "f1:reserve", `{"fingerprint":"\ud800x"}`, "fingerprint escapes half of a UTF-16 surrogate pair"},
			{"lone low surrogate", "f1:reserve", `{"fingerprint":"\udc00"}`, "surrogate"},
			{"high surrogate at the end", "f1:reserve", `{"fingerprint":"a\ud83d"}`, "surrogate"},
			{"surrogate in a header value", "f1:complete", `{"owner_token":"` + owner + `","response":{"status":200,"headers":{"X-A":"\udfff"}}}`, "response.headers[\"X-A\"] escapes"},
			{"surrogate in a reason", "f1:force-release", `{"reason":"\ud800"}`, "reason escapes"},
			{"duplicate field", "f1:reserve", `{"fingerprint":"a","fingerprint":"b"}`, `names field "fingerprint" twice`},
			{"duplicate field, escaped", "f1:reserve", `{"fingerprint":"a","\u0066ingerprint":"b"}`, `names field "fingerprint" twice`},
			{"duplicate lease", "f1:reserve", `{"lease_ms":1000,"lease_ms":2000}`, `"lease_ms" twice`},
			{"duplicate in response", "f1:complete", `{"owner_token":"` + owner + `","response":{"status":200,"status":201}}`, `names field "status" twice`},
			{"duplicate header", "f1:complete", `{"owner_token":"` + owner + `","response":{"status":200,"headers":{"A":"1","A":"2"}}}`, `response.headers names field "A" twice`},
			{"duplicate policy field", "", `{"max_lease_ms":60000,"max_lease_ms":1000}`, `"max_lease_ms" twice`},
			{"duplicate in a batch item", "batch", `{"items":[{"key":"a","key":"b"}]}`, `"key" twice`},
			{"duplicate items", "batch", `{"items":[{"key":"a"}],"items":[{"key":"b"}]}`, `"items" twice`},
		}
		for _, c := range bad {
			method, path := "POST", ns+c.path
			switch c.path {
			case "":
				method, path = "PUT", "/v1/namespaces/test/policy"
			case "batch":
				path = "/v1/namespaces/test/keys:batch-reserve"
			}
			r := h.do(method, path, c.body)
			if c.path == "batch" && r.status == 200 {
				// An item's problem is that item's result.
				res := r.body["results"].([]any)[0].(map[string]any)
				e, _ := res["error"].(map[string]any)
				if e["code"] != string(CodeInvalidArgument) || !strings.Contains(e["message"].(string), c.want) {
					t.Errorf("fast=%v %s: item result %v, want INVALID_ARGUMENT naming %q", fast, c.name, res, c.want)
				}
				continue
			}
			if r.status != 400 || r.errCode() != string(CodeInvalidArgument) || !strings.Contains(r.errMessage(), c.want) {
				t.Errorf("fast=%v %s: got %d %s, want 400 INVALID_ARGUMENT naming %q", fast, c.name, r.status, r, c.want)
			}
		}
		// Valid surrogate pairs, U+FFFD itself and UTF-8 text are taken, and two
		// fingerprints that differ only in bytes encoding/json would have
		// replaced stay different.
		for _, fp := range []string{`"\ud83d\ude00"`, `"\ufffd"`, `"é😀"`, `"\\ud800"`} {
			r := h.do("POST", ns+"ok-"+string(rune('a'+len(fp)))+":reserve", `{"fingerprint":`+fp+`}`)
			if r.status != 200 {
				t.Errorf("fast=%v fingerprint %s: %d %s", fast, fp, r.status, r)
			}
		}
		r := h.do("POST", ns+"fp:reserve", `{"fingerprint":"\ufffd\ufffd","owner_token":"`+owner+`"}`)
		if r.status != 200 || r.body["outcome"] != "ACQUIRED" {
			t.Fatalf("fast=%v: %d %s", fast, r.status, r)
		}
		r = h.do("POST", ns+"fp:reserve", "{\"fingerprint\":\"\xfe\xff\"}")
		if r.status != 400 {
			t.Errorf("fast=%v: invalid UTF-8 matched a stored U+FFFD fingerprint: %d %s", fast, r.status, r)
		}
	}
}

// TestLoneSurrogate covers the escape scanner's corners.
func TestLoneSurrogate(t *testing.T) {
	for raw, want := range map[string]bool{
		`"abc"`:               false,
		`"\ud83d\ude00"`:      false,
		`"\uD83D\uDE00"`:      false,
		`"\\ud800"`:           false, // an escaped backslash, then "ud800"
		`"\\\ud800"`:          true,
		`"\ud800"`:            true,
		`"\udc00"`:            true,
		`"\ud800\u0041"`:      true,
		`"\ud800\n"`:          true,
		`"\ud800\ud800"`:      true,
		`"x\ud83d\ude00\udc"`: false, // not valid JSON; encoding/json refuses it
		`"\u00e9\n\t\""`:      false,
	} {
		if got := loneSurrogate([]byte(raw)); got != want {
			t.Errorf("loneSurrogate(%s) = %v, want %v", raw, got, want)
		}
	}
}

// TestHTTPMessagesNameWhatApplies: a too-large body names the limit of its
// own call, and the unknown-path and unknown-verb messages list every route
// and verb.
func TestHTTPMessagesNameWhatApplies(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	limit := MaxRequestBytesFor(DefaultMaxResponseBytes)
	big := `{"fingerprint":"` + strings.Repeat("x", int(limit)) + `"}`
	for _, c := range []struct{ method, path string }{
		{"POST", ns + "k:reserve"}, {"PUT", "/v1/namespaces/test/policy"}, {"POST", ns + "k:heartbeat"},
	} {
		r := h.do(c.method, c.path, big)
		h.expectError(r, 413, CodePayloadTooLarge)
		if strings.Contains(r.errMessage(), "response") || !strings.Contains(r.errMessage(), "a JSON request body is at most") {
			t.Errorf("%s %s: %q, want the request body's limit without the stored response's", c.method, c.path, r.errMessage())
		}
	}
	r := h.do("POST", ns+"k:complete", big)
	if h.expectError(r, 413, CodePayloadTooLarge); !strings.Contains(r.errMessage(), "stored response body of at most 1048576") {
		t.Errorf("complete: %q, want the stored response's limit", r.errMessage())
	}
	r = h.do("POST", "/v1/namespaces/test/keys:batch-reserve", `{"items":[`+strings.Repeat(`{"key":"k"},`, 500000)+`{"key":"k"}]}`)
	if h.expectError(r, 413, CodePayloadTooLarge); !strings.Contains(r.errMessage(), "a batch body is at most 4194304 bytes") {
		t.Errorf("batch: %q", r.errMessage())
	}

	r = h.do("POST", ns+"k:nope", "")
	h.expectError(r, 404, CodeNotFound)
	for verb := range verbs {
		if !strings.Contains(r.errMessage(), ":"+verb) {
			t.Errorf("unknown verb message %q omits :%s", r.errMessage(), verb)
		}
	}
	r = h.do("POST", ns+"k", "")
	for verb := range verbs {
		if !strings.Contains(r.errMessage(), ":"+verb) {
			t.Errorf("POST without a verb: %q omits :%s", r.errMessage(), verb)
		}
	}
	for _, path := range []string{"/v2/x", "/v1/namespaces/test/nothing", "/elsewhere"} {
		r = h.do("GET", path, "")
		h.expectError(r, 404, CodeNotFound)
		for _, route := range []string{":checkpoint", ":force-release", "keys:batch-reserve", ":batch-complete", "/policy", "/v1/topology", "GET /v1/namespaces/{namespace}/keys (list)", "DELETE"} {
			if !strings.Contains(r.errMessage(), route) {
				t.Errorf("GET %s: %q omits %s", path, r.errMessage(), route)
			}
		}
	}
}

// TestHTTPDeleteOfAVerbPath: DELETE .../keys/m1:reserve is refused (405,
// Allow: POST) rather than deleting a key named "m1:reserve"; that key is
// deleted as m1%3Areserve.
func TestHTTPDeleteOfAVerbPath(t *testing.T) {
	b := newMemBackend(newFakeClock())
	h := newHarness(t, b, nil)
	owner := "owner-token-00001"
	if r := h.do("POST", ns+"m1%3Areserve:reserve", `{"owner_token":"`+owner+`"}`); r.status != 200 {
		t.Fatalf("reserve: %d %s", r.status, r)
	}
	r := h.do("DELETE", ns+"m1:reserve", "")
	h.expectError(r, 405, CodeMethodNotAllowed)
	if r.header.Get("Allow") != "POST" || !strings.Contains(r.errMessage(), "%3A") {
		t.Fatalf("DELETE m1:reserve: Allow %q, %q", r.header.Get("Allow"), r.errMessage())
	}
	if r := h.do("GET", ns+"m1%3Areserve", ""); r.status != 200 {
		t.Fatalf("the key is gone after a refused DELETE: %d %s", r.status, r)
	}
	if r := h.do("DELETE", ns+"m1%3Areserve", `{"reason":"test"}`); r.status != 200 {
		t.Fatalf("DELETE m1%%3Areserve: %d %s", r.status, r)
	}
	// A ':' that is not followed by a verb is part of the key, as in GET.
	if r := h.do("DELETE", ns+"m1:other", ""); r.status != 404 || r.errCode() != string(CodeNotFound) {
		t.Fatalf("DELETE m1:other: %d %s, want 404 (no such key)", r.status, r)
	}
}

// TestCheckJSONText: what handlers that decode with encoding/json use to
// refuse what it would rewrite, at any depth.
func TestCheckJSONText(t *testing.T) {
	for body, want := range map[string]string{
		`{"topology":{"cluster":"a"},"dead":[]}`:                      "",
		`{"a":[{"b":1},{"b":2}],"c":{"d":{"e":1}}}`:                   "",
		`{"topology":"x","topology":"y"}`:                             `names field "topology" twice`,
		`{"topology":{"regions":[{"name":"a","name":"b"}]}}`:          `names field "topology.regions[0].name" twice`,
		`{"a":{"b":1},"c":{"b":1,"d":{"e":1,"e":2}}}`:                 `"c.d.e" twice`,
		"{\"topology\":\"\xff\"}":                                     "not valid UTF-8 (byte 13)",
		`{"topology":`:                                                "", // invalid JSON: encoding/json says so
		`{"a":1,"\u0061":2}`:                                          `"a" twice`,
		`[{"a":1},{"a":1}]`:                                           "",
		`{"list":[{"k":1,"k":1}]}`:                                    `"list[0].k" twice`,
		`{"x":"{\"a\":1,\"a\":2}"}`:                                   "", // a string, not an object
		`{"dead":["n1","n1"],"topology":{"cluster":"c","version":1}}`: "",
	} {
		e := CheckJSONText([]byte(body))
		switch {
		case want == "" && e != nil:
			t.Errorf("%s: %v, want nil", body, e)
		case want != "" && (e == nil || e.Code != CodeInvalidArgument || !strings.Contains(e.Message, want)):
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming %q", body, e, want)
		}
	}
}
