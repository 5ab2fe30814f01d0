package docs

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/internal/serving"
	"github.com/idem-dev/idem/server"
)

// TestAnswersBeforeIdemAreDocumented pins the documented exception to "every
// error is the JSON error body": the two answers Go's HTTP server writes while
// it reads a request line and headers, before idem's handler runs, on the
// HTTP server every idem process uses (internal/serving), in front of the
// real API handler. Should net/http change them, or should idem come to
// answer them itself, this fails, and api.md's Errors section with it.
func TestAnswersBeforeIdemAreDocumented(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.Backend = backend.NewMem(backend.MemConfig{})
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := serving.HTTP("http", ln, srv.HTTPHandler(), slog.New(slog.DiscardHandler))
	go func() { _ = hs.Serve() }()
	t.Cleanup(hs.Close)

	send := func(requestLine string) (*http.Response, string) {
		t.Helper()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		go func() { _, _ = io.WriteString(conn, requestLine+"\r\nHost: idem\r\nContent-Length: 0\r\n\r\n") }()
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%.60s...: %v", requestLine, err)
		}
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	plain := func(what string, resp *http.Response, body string, status int) {
		t.Helper()
		if resp.StatusCode != status || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" ||
			!strings.HasPrefix(body, http.StatusText(status)) && !strings.HasPrefix(body, strings.TrimSpace(resp.Status)) {
			t.Errorf("%s: %s %q %q; api.md documents %d as plain text written by Go's HTTP server", what, resp.Status, resp.Header.Get("Content-Type"), body, status)
		}
	}
	// The key is in the request line, which counts toward the 64 KiB of
	// request headers.
	resp, body := send("GET /v1/namespaces/docs/keys/" + strings.Repeat("k", 100_000) + " HTTP/1.1")
	plain("a 100,000-character key", resp, body, http.StatusRequestHeaderFieldsTooLarge)
	resp, body = send("GET /v1/namespaces/docs/keys/a%zzb HTTP/1.1")
	plain("a malformed percent escape", resp, body, http.StatusBadRequest)
	// Below the header limit, idem answers: a JSON error naming the key's limit.
	resp, body = send("GET /v1/namespaces/docs/keys/" + strings.Repeat("k", 30_000) + " HTTP/1.1")
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(body, "INVALID_ARGUMENT") {
		t.Errorf("a 30,000-character key: %s %q %.200s, want idem's JSON 400", resp.Status, resp.Header.Get("Content-Type"), body)
	}

	errs := section(t, readAPIDoc(t), "Errors")
	for _, want := range []string{"| 431 | `431 Request Header Fields Too Large` |", "| 400 | `400 Bad Request`", "text/plain", "malformed percent escape"} {
		if !strings.Contains(errs, want) {
			t.Errorf("api.md, Errors: does not document %q", want)
		}
	}
}
