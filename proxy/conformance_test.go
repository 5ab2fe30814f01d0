package proxy_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"github.com/idem-dev/idem/proxy"
)

// The proxy and client.Middleware run the same engine; the same requests
// to the same service, once through the proxy (store: a backend.Backend) and
// once through the middleware (store: the Go client), get the same answers.
func TestProxyAndMiddlewareAgree(t *testing.T) {
	const maxRequest, maxStored = 1000, 500

	up := newUpstream(t)
	proxied, _ := startProxy(t, up.srv.URL, proxy.BackendStore(newBackend(time.Second)), func(c *proxy.Config) {
		c.MaxRequestBytes, c.MaxStoredBodyBytes = maxRequest, maxStored
	})

	store, err := idemtest.Start(idemtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	ccfg := client.DefaultConfig(store.Addr())
	ccfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	c, err := client.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	local := &upstream{runs: make(map[string]int), tokens: make(map[string][]uint64)}
	wrapped := httptest.NewServer(client.Middleware(c, func(m *client.MiddlewareConfig) {
		m.MaxRequestBytes, m.MaxStoredBodyBytes = maxRequest, maxStored
	})(http.HandlerFunc(local.serve)))
	t.Cleanup(wrapped.Close)

	steps := []struct {
		method, path, key, body string
	}{
		{"POST", "/ok", "a", "1"},
		{"POST", "/ok", "a", "1"},
		{"POST", "/ok", "a", "2"},
		{"PATCH", "/ok", "a", "1"},
		{"POST", "/status/503", "b", ""},
		{"POST", "/status/503", "b", ""},
		{"POST", "/status/404", "c", ""},
		{"POST", "/status/404", "c", ""},
		{"POST", "/big?n=800", "d", ""},
		{"POST", "/big?n=800", "d", ""},
		{"POST", "/big?n=300", "d2", ""},
		{"POST", "/big?n=300", "d2", ""},
		{"POST", "/ok", "", "no key"},
		{"POST", "/ok", "", "no key"},
		{"GET", "/ok", "e", ""},
		{"GET", "/ok", "e", ""},
		{"PUT", "/ok", "e2", "x"},
		{"POST", "/ok", "a b", ""},
		{"POST", "/ok", `"quoted"`, ""},
		{"POST", "/ok", "quoted", ""},
		{"POST", "/ok", "f", strings.Repeat("z", maxRequest+1)},
		{"POST", "/ok", "g", strings.Repeat("z", maxRequest)},
	}
	for i, s := range steps {
		var headers []string
		if s.key != "" {
			headers = []string{"Idempotency-Key", s.key}
		}
		p := summarize(send(t, proxied.URL, s.method, s.path, s.body, headers...))
		m := summarize(send(t, wrapped.URL, s.method, s.path, s.body, headers...))
		if p != m {
			t.Errorf("step %d, %s %s key %q:\nproxy      %s\nmiddleware %s", i+1, s.method, s.path, s.key, p, m)
		}
	}
}

// summarize keeps what a client of either sees the same: status, body
// (problem type for problems), and the headers the contract speaks of.
func summarize(r reply) string {
	body := r.Body
	if r.Header.Get("Content-Type") == "application/problem+json" {
		var p struct{ Type string }
		_ = json.Unmarshal([]byte(r.Body), &p)
		body = "problem " + p.Type
	}
	if len(body) > 80 {
		body = fmt.Sprintf("%d bytes starting %q", len(body), body[:20])
	}
	return fmt.Sprintf("%d %q replayed=%q omitted=%q type=%q custom=%q multi=%q cookie=%v location=%q",
		r.Status, body, r.Header.Get("Idempotent-Replayed"), r.Header.Get("Idempotent-Body-Omitted"),
		r.Header.Get("Content-Type"), r.Header.Get("X-Custom"), r.Header.Get("X-Multi"), r.Header.Get("Set-Cookie") != "", r.Header.Get("Location"))
}
