package server

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strconv"
	"testing"

	"github.com/idem-dev/idem/fsm"
)

// The JSON API's hot path in one process: a handler over the in-memory
// backend, so that the figures are the codec's and the handler's, not a
// Raft group's. Run with
//
//	go test -run XXX -bench JSON -benchmem ./server

// benchWriter is a reusable http.ResponseWriter that keeps nothing, so the
// allocations counted are the handler's.
type benchWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }
func (w *benchWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

func (w *benchWriter) reset() {
	clear(w.h)
	w.status, w.n = 0, 0
}

// benchRequest is a POST whose body reader is rewound for every iteration.
type benchRequest struct {
	req  *http.Request
	body *bytes.Reader
	data []byte
}

func newBenchRequest(b *testing.B, path string, data []byte) *benchRequest {
	r := &benchRequest{body: bytes.NewReader(data), data: data}
	req, err := http.NewRequest(http.MethodPost, "http://idem"+path, r.body)
	if err != nil {
		b.Fatal(err)
	}
	req.ContentLength = int64(len(data))
	r.req = req
	return r
}

func (r *benchRequest) rewind() { r.body.Reset(r.data) }

const benchOwner = "owner-0123456789abcdef0123456789"

func benchCompleteBody() []byte {
	body := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'x'}, 512))
	return []byte(`{"owner_token":"` + benchOwner + `","response":{"status":200,"headers":{"Content-Type":"application/octet-stream"},"body":"` + body + `"},"retention_s":3600}`)
}

// BenchmarkJSONCycle is the bench/peers cycle through the handler: reserve
// a fresh key, complete it with a 512-byte response.
func BenchmarkJSONCycle(b *testing.B) {
	srv, err := New(Config{Backend: newMemBackend(newFakeClock())})
	if err != nil {
		b.Fatal(err)
	}
	h := srv.HTTPHandler()
	reserveBody := []byte(`{"owner_token":"` + benchOwner + `","lease_ms":30000}`)
	completeBody := benchCompleteBody()
	w := &benchWriter{h: http.Header{}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key := "k" + strconv.Itoa(i)
		r := newBenchRequest(b, ns+key+":reserve", reserveBody)
		w.reset()
		h.ServeHTTP(w, r.req)
		if w.status != http.StatusOK {
			b.Fatalf("reserve: %d", w.status)
		}
		r = newBenchRequest(b, ns+key+":complete", completeBody)
		w.reset()
		h.ServeHTTP(w, r.req)
		if w.status != http.StatusOK {
			b.Fatalf("complete: %d", w.status)
		}
	}
}

// BenchmarkJSONReserveReplay answers a reserve of a completed key: the
// largest hot answer (the stored response, base64).
func BenchmarkJSONReserveReplay(b *testing.B) {
	srv, err := New(Config{Backend: newMemBackend(newFakeClock())})
	if err != nil {
		b.Fatal(err)
	}
	h := srv.HTTPHandler()
	w := &benchWriter{h: http.Header{}}
	r := newBenchRequest(b, ns+"k:reserve", []byte(`{"owner_token":"`+benchOwner+`","lease_ms":30000}`))
	h.ServeHTTP(w, r.req)
	r = newBenchRequest(b, ns+"k:complete", benchCompleteBody())
	h.ServeHTTP(w, r.req)
	r = newBenchRequest(b, ns+"k:reserve", []byte(`{"lease_ms":30000}`))
	b.ReportAllocs()
	for b.Loop() {
		r.rewind()
		w.reset()
		h.ServeHTTP(w, r.req)
		if w.status != http.StatusOK {
			b.Fatalf("reserve: %d", w.status)
		}
	}
}

// BenchmarkJSONDecodeComplete decodes a complete's body with a 512-byte
// response.
func BenchmarkJSONDecodeComplete(b *testing.B) {
	data := benchCompleteBody()
	b.ReportAllocs()
	for b.Loop() {
		if _, e := decodeComplete(data); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkJSONDecodeReserve decodes a reserve's body.
func BenchmarkJSONDecodeReserve(b *testing.B) {
	data := []byte(`{"owner_token":"` + benchOwner + `","lease_ms":30000}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, e := decodeReserve(data); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkJSONEncodeAcquired writes an ACQUIRED answer.
func BenchmarkJSONEncodeAcquired(b *testing.B) {
	cmd := &fsm.Command{Op: fsm.OpReserve, OwnerToken: benchOwner}
	res := fsm.Result{Outcome: fsm.OutcomeAcquired, FencingToken: 12345, LeaseExpiresAt: 1764840000123456789}
	w := &benchWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		w.reset()
		writeReserve(w, cmd, res)
	}
}
