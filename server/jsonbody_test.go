package server

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// plainJSONString must agree with encoding/json wherever it answers, and
// leave to encoding/json whatever it cannot decode by copying.
func TestPlainJSONStringAgreesWithEncodingJSON(t *testing.T) {
	for _, raw := range []string{
		`""`, `"abc"`, `"k_T6HB-U-CxAjBCIevvX6Q"`, `"eyJpZCI6MX0="`, `"a b ~ !"`,
		`"a\"b"`, `"a\\b"`, `"\u0041"`, `"tab\there"`, `"é"`, "\"\x7f\"", "\"\x01\"",
		`"`, `"abc`, `abc"`, `123`, `null`, `{"a":"b"}`, `["x"]`,
	} {
		got, ok := plainJSONString([]byte(raw))
		var want string
		err := json.Unmarshal([]byte(raw), &want)
		switch {
		case ok && err != nil:
			t.Errorf("%s: plain %q, but encoding/json fails: %v", raw, got, err)
		case ok && got != want:
			t.Errorf("%s: plain %q, encoding/json %q", raw, got, want)
		}
	}
	for _, raw := range []string{`"abc"`, `"eyJpZCI6MX0="`, `""`} {
		if _, ok := plainJSONString([]byte(raw)); !ok {
			t.Errorf("%s: not taken by the fast path", raw)
		}
	}
	for _, raw := range []string{`"a\"b"`, `"\u0041"`, `"é"`, `123`} {
		if _, ok := plainJSONString([]byte(raw)); ok {
			t.Errorf("%s: taken by the fast path, which cannot decode it", raw)
		}
	}
}

func FuzzPlainJSONString(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b"`, `"\u00e9"`, `""`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := plainJSONString(raw)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(raw, &want); err != nil || got != want {
			t.Fatalf("%q: plain %q; encoding/json %q, %v", raw, got, want, err)
		}
	})
}

// scanObject takes only what encoding/json decodes to the same members.
func FuzzScanObjectAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, ` {"a":1} `, `{"a":"x","b":{"c":[1,2,{"d":null}]},"e":true,"f":false}`, `{"a":1,"a":2}`,
		`{"a":01}`, `{"a":-0.5e+3}`, `{"a":1.}`, `{"a":"\u00e9\n"}`, `{"\u0061":1}`, `{"a":1}x`, `{"a":[}`,
		`{"owner_token":"o","response":{"status":201,"headers":{"Content-Type":"application/json"},"body":"eyJpZCI6MX0="}}`,
		"{\"a\":\"\xff\"}", `{"a":"\x"}`, `{"a":tru}`, `{"a" 1}`, `{"a":1,}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fields, ok := scanObject(data, nil)
		var want map[string]json.RawMessage
		err := json.Unmarshal(data, &want)
		if !ok {
			return
		}
		if err != nil || want == nil {
			t.Fatalf("%q: scanObject took it, encoding/json: %v (%v)", data, err, want)
		}
		if len(fields) != len(want) {
			t.Fatalf("%q: %d members, encoding/json %d", data, len(fields), len(want))
		}
		for _, f := range fields {
			if w, found := want[string(f.name)]; !found || string(w) != string(f.raw) {
				t.Fatalf("%q: member %q = %q, encoding/json %q (%v)", data, f.name, f.raw, w, found)
			}
		}
	})
}

// The decoders answer the same, parameters and messages, with the fast
// path on and off.
func FuzzDecodeFastAndSlowAgree(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"fingerprint":"sha:1","lease_ms":30000,"owner_token":"owner-0123456789abcdef","wait_ms":100}`,
		`{"owner_token":"o","response":{"status":201,"headers":{"Content-Type":"application/json","X-A":"b"},"body":"eyJpZCI6MX0="},"retention_s":60}`,
		`{"owner_token":"o","response":{"status":200,"headers":{"X":"\u00e9"},"body":"eyJpZCI6MX0"}}`,
		`{"owner_token":"o","response":{"status":200,"headers":{"X":1},"body":"e-_"}}`,
		`{"owner_token":"o","lease_ms":1e3}`, `{"response":{"body":"!!"}}`, `{"a":1}`, `{"lease_ms":-1}`,
		`{"lease_ms":"1"}`, `{"owner_token":"a","owner_token":"b"}`, `{"name":"n","data":"AAEC","owner_token":"o"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		type result struct {
			reserve    reserveParams
			complete   completeParams
			checkpoint checkpointParams
			errs       [3]*Error
		}
		decode := func(fast bool) result {
			scanFast = fast
			defer func() { scanFast = true }()
			var r result
			r.reserve, r.errs[0] = decodeReserve(data)
			r.complete, r.errs[1] = decodeComplete(data)
			r.checkpoint, r.errs[2] = decodeCheckpoint(data)
			return r
		}
		fast, slow := decode(true), decode(false)
		if !reflect.DeepEqual(fast.reserve, slow.reserve) || !reflect.DeepEqual(fast.complete, slow.complete) ||
			!reflect.DeepEqual(fast.checkpoint, slow.checkpoint) {
			t.Fatalf("%q: fast %+v, slow %+v", data, fast, slow)
		}
		for i := range fast.errs {
			if (fast.errs[i] == nil) != (slow.errs[i] == nil) || fast.errs[i] != nil && !sameProblems(fast.errs[i].Message, slow.errs[i].Message) {
				t.Fatalf("%q: decoder %d: fast %v, slow %v", data, i, fast.errs[i], slow.errs[i])
			}
		}
	})
}

// sameProblems compares two messages as sets of problems: the slow path
// reports the problems of response.headers in a map's order.
func sameProblems(a, b string) bool {
	pa, pb := strings.Split(a, "; "), strings.Split(b, "; ")
	slices.Sort(pa)
	slices.Sort(pb)
	return slices.Equal(pa, pb)
}
