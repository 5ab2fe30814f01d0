package server

import (
	"encoding/json"
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
