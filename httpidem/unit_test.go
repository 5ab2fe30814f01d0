package httpidem

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/testutil"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", 255)
	for _, tc := range []struct {
		name    string
		values  []string
		key     string
		present bool
		bad     bool
	}{
		{"absent", nil, "", false, false},
		{"bare", []string{"abc-123"}, "abc-123", true, false},
		{"bare with whitespace", []string{" \tabc "}, "abc", true, false},
		{"sf-string", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", true, false},
		{"sf-string escapes", []string{`"a\"b\\c"`}, `a"b\c`, true, false},
		{"255 bytes", []string{long}, long, true, false},
		{"256 bytes", []string{long + "k"}, "", true, true},
		{"empty", []string{""}, "", true, true},
		{"empty string", []string{`""`}, "", true, true},
		{"space inside quotes", []string{`"a b"`}, "", true, true},
		{"space in bare value", []string{"a b"}, "", true, true},
		{"non-ASCII", []string{"clé"}, "", true, true},
		{"unterminated", []string{`"abc`}, "", true, true},
		{"bad escape", []string{`"a\nb"`}, "", true, true},
		{"parameters", []string{`"abc";p=1`}, "", true, true},
		{"two fields", []string{"a", "b"}, "", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, present, err := ParseKey(tc.values)
			if present != tc.present || (err != nil) != tc.bad || (!tc.bad && key != tc.key) {
				t.Fatalf("ParseKey(%q) = %q, %v, %v; want %q, %v, error %v", tc.values, key, present, err, tc.key, tc.present, tc.bad)
			}
		})
	}
}

func TestParseStatusSet(t *testing.T) {
	s, err := ParseStatusSet(DefaultReleaseStatuses)
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{500: true, 503: true, 599: true, 408: true, 425: true, 429: true,
		200: false, 201: false, 302: false, 400: false, 404: false, 409: false, 422: false, 499: false} {
		if s.Has(code) != want {
			t.Errorf("default set Has(%d) = %v, want %v", code, !want, want)
		}
	}
	if _, err := ParseStatusSet("5xx, 600, abc, 6xx"); err == nil || strings.Count(err.Error(), "\n") != 2 {
		t.Errorf("three bad entries: err = %v, want all three reported", err)
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	err := Config{Policy: Policy{
		Lease:             50 * time.Millisecond,
		HeartbeatInterval: time.Minute,
		Retention:         1500 * time.Millisecond,
		ReleaseStatuses:   "5xx,999",
		NamespaceHeader:   "X Tenant",
		MaxRequestBytes:   -1,
		Methods:           []string{},
	}}.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"Store", "Lease", "HeartbeatInterval", "Retention", "ReleaseStatuses", "NamespaceHeader", "MaxRequestBytes", "Methods"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() does not mention %s: %v", want, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Store = nopStore{}
	if err := cfg.Validate(); err != nil {
		t.Errorf("DefaultConfig with a Store: %v", err)
	}
}

type nopStore struct{ Store }

func TestNamespaceFromCert(t *testing.T) {
	cert := func(cn string) *x509.Certificate {
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		_, c, _ := testutil.Certificate(t, tmpl, nil, nil)
		return c
	}
	ns, err := NamespaceFromCert(cert("billing-svc"))
	if err != nil || ns != "billing-svc" {
		t.Errorf("CN billing-svc: %q, %v", ns, err)
	}
	for _, cn := range []string{"Billing Service", "spki-0123", "", strings.Repeat("a", 64)} {
		c := cert(cn)
		ns, err := NamespaceFromCert(c)
		sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
		want := CertNamespacePrefix + hex.EncodeToString(sum[:20])
		if err != nil || ns != want || !ValidNamespace(ns) {
			t.Errorf("CN %q: %q, %v; want %q", cn, ns, err, want)
		}
	}
	if a, b := mustNS(t, cert("x y")), mustNS(t, cert("x y")); a == b {
		t.Errorf("two keys with the same unusable CN share namespace %q", a)
	}
}

func mustNS(t *testing.T, c *x509.Certificate) string {
	ns, err := NamespaceFromCert(c)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func TestReadBodySpoolsAndBounds(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000) // 10,000 bytes
	for _, spoolAt := range []int64{100, 1 << 20} {
		h := sha256.New()
		b, err := readBody(bytes.NewReader(data), 20000, spoolAt, t.TempDir(), h)
		if err != nil {
			t.Fatal(err)
		}
		if spooled := b.file != nil; spooled != (spoolAt < int64(len(data))) {
			t.Errorf("spoolAt %d: spooled = %v", spoolAt, spooled)
		}
		for range 2 { // the reader can be made twice (a retried upstream request)
			got, err := io.ReadAll(b.reader())
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("spoolAt %d: read back %d bytes, %v", spoolAt, len(got), err)
			}
		}
		if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) {
			t.Errorf("spoolAt %d: hash does not cover the body", spoolAt)
		}
		b.close()
	}
	if _, err := readBody(bytes.NewReader(data), int64(len(data))-1, 100, t.TempDir(), sha256.New()); !errors.Is(err, errBodyTooLarge) {
		t.Errorf("body one byte over the limit: %v", err)
	}
	if b, err := readBody(bytes.NewReader(data), int64(len(data)), 100, t.TempDir(), sha256.New()); err != nil || b.size != int64(len(data)) {
		t.Errorf("body exactly at the limit: %v", err)
	}
}

func TestFingerprintCoversEveryPart(t *testing.T) {
	fp := func(method, target, body string, hdr http.Header) string {
		r := httptest.NewRequest(method, target, nil)
		for k, v := range hdr {
			r.Header[k] = v
		}
		h := newFingerprintHash(r, []string{"Content-Type"})
		h.Write([]byte(body))
		return fingerprintOf(h)
	}
	base := fp("POST", "/a?x=1", "body", nil)
	if len(base) != len("sha256:")+64 {
		t.Fatalf("fingerprint %q", base)
	}
	if again := fp("POST", "/a?x=1", "body", nil); again != base {
		t.Fatal("the fingerprint is not deterministic")
	}
	for name, other := range map[string]string{
		"method":      fp("PATCH", "/a?x=1", "body", nil),
		"path":        fp("POST", "/b?x=1", "body", nil),
		"query":       fp("POST", "/a?x=2", "body", nil),
		"body":        fp("POST", "/a?x=1", "bodY", nil),
		"header":      fp("POST", "/a?x=1", "body", http.Header{"Content-Type": {"text/plain"}}),
		"path/query":  fp("POST", "/a%3Fx=1", "body", nil),
		"query/body":  fp("POST", "/a?x=1b", "ody", nil),
		"no query":    fp("POST", "/a", "body", nil),
		"escaped '/'": fp("POST", "/a%2Fb?x=1", "body", nil),
	} {
		if other == base {
			t.Errorf("changing the %s does not change the fingerprint", name)
		}
	}
	if fp("POST", "/a%2Fb", "", nil) == fp("POST", "/a/b", "", nil) {
		t.Error("an escaped '/' and a plain one give the same fingerprint")
	}
}

func TestStoredHeaders(t *testing.T) {
	p := newHeaderPolicy(nil, []string{"X-Secret"})
	h := http.Header{
		"Content-Type":             {"application/json"},
		"X-Multi":                  {"a", "b"},
		"Connection":               {"close, X-Hop"},
		"X-Hop":                    {"1"},
		"Keep-Alive":               {"timeout=5"},
		"Transfer-Encoding":        {"chunked"},
		"Set-Cookie":               {"s=1"},
		"Content-Length":           {"12"},
		"X-Secret":                 {"s"},
		"X-Outer":                  {"from outer middleware"},
		"X-Changed":                {"new"},
		"Idempotent-Replayed":      {"true"},
		http.TrailerPrefix + "X-T": {"t"},
	}
	base := http.Header{"X-Outer": {"from outer middleware"}, "X-Changed": {"old"}}
	got, dropped := p.stored(h, base)
	want := map[string]string{"Content-Type": "application/json", "X-Multi": "a, b", "X-Changed": "new"}
	if len(got) != len(want) || len(dropped) != 0 {
		t.Fatalf("stored %v (dropped %v), want %v", got, dropped, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("stored[%s] = %q, want %q", k, got[k], v)
		}
	}
	allow := newHeaderPolicy([]string{"content-type"}, nil)
	if got, _ := allow.stored(h, nil); len(got) != 1 || got["Content-Type"] == "" {
		t.Errorf("allow list Content-Type: stored %v", got)
	}
	big := http.Header{"X-Big": {strings.Repeat("v", contract.MaxHeaderValueBytes+1)}, "X-Ctl": {"a\x01b"}, "X-Ok": {"ok"}}
	if got, dropped := p.stored(big, nil); len(got) != 1 || len(dropped) != 2 {
		t.Errorf("out-of-bounds headers: stored %v, dropped %v", got, dropped)
	}
	many := http.Header{}
	for i := range 150 {
		many.Set("X-H"+strings.Repeat("i", i), "v")
	}
	if got, dropped := p.stored(many, nil); len(got) != contract.MaxHeaders-1 || len(dropped) != 150-(contract.MaxHeaders-1) {
		t.Errorf("150 headers: stored %d, dropped %d", len(got), len(dropped))
	}
}

func TestCaptureWriterHoldsAndSniffs(t *testing.T) {
	rec := httptest.NewRecorder()
	cw := newCaptureWriter(rec, 10)
	_, _ = cw.Write([]byte("<html>"))
	cw.Flush() // deferred: not an event stream
	if rec.Flushed || rec.Body.Len() != 0 {
		t.Fatal("a held response reached the caller before it was stored")
	}
	_, _ = cw.Write([]byte("0123456789")) // outgrows the limit: streams from here
	if !cw.overflow || rec.Body.String() != "<html>0123456789" || rec.Code != 200 {
		t.Fatalf("overflow: body %q, code %d", rec.Body.String(), rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("sniffed Content-Type %q", ct)
	}

	rec = httptest.NewRecorder()
	cw = newCaptureWriter(rec, 1<<10)
	cw.Header().Set("Content-Type", "text/event-stream")
	_, _ = cw.Write([]byte("data: 1\n\n"))
	cw.Flush()
	if !rec.Flushed || rec.Body.String() != "data: 1\n\n" {
		t.Error("a flushed event stream did not stream")
	}

	rec = httptest.NewRecorder()
	cw = newCaptureWriter(rec, 1<<10)
	cw.WriteHeader(http.StatusNoContent)
	if _, err := cw.Write([]byte("x")); !errors.Is(err, http.ErrBodyNotAllowed) {
		t.Errorf("body on 204: %v", err)
	}
	if !ResetResponse(cw) || cw.status != 0 {
		t.Error("ResetResponse of a held response failed")
	}
	cw.deliver()
	if rec.Code != 200 {
		t.Errorf("a handler that wrote nothing: %d, want 200", rec.Code)
	}
	if ResetResponse(cw) {
		t.Error("ResetResponse of a delivered response succeeded")
	}
}

func TestParsePreferWait(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want time.Duration
		ok   bool
	}{
		{nil, 0, false},
		{[]string{"wait=5"}, 5 * time.Second, true},
		{[]string{"respond-async, WAIT = 10"}, 10 * time.Second, true},
		{[]string{"return=minimal", `wait="3"; foo=bar`}, 3 * time.Second, true},
		{[]string{"wait=-1"}, 0, false},
		{[]string{"wait=soon"}, 0, false},
		{[]string{"handling=lenient"}, 0, false},
	} {
		got, ok := ParsePreferWait(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("ParsePreferWait(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
