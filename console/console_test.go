package console_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/console"
	"github.com/idem-dev/idem/security/auth"
	"github.com/idem-dev/idem/server"
)

// stack is the JSON API over the in-memory backend with an auth file in
// front and the console at /ui/, wired as idemnode and idemrouter wire it.
type stack struct {
	srv *httptest.Server
}

const (
	adminToken  = "admin-token"
	readerToken = "reader-token"
)

func tokenHash(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

func newStack(t *testing.T) *stack {
	t.Helper()
	file := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(file, []byte(`principals:
  - {name: ops, token_sha256: `+tokenHash(adminToken)+`, namespaces: ["*"], role: admin}
  - {name: other-reader, token_sha256: `+tokenHash(readerToken)+`, namespaces: [other], role: reader}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	authz, err := auth.New(auth.Config{File: file})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	var outer http.Handler
	ccfg := console.DefaultConfig()
	ccfg.API = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { outer.ServeHTTP(w, r) })
	ccfg.Registry = reg
	ccfg.Locate = func(ns, key string) (console.Location, bool) {
		return console.Location{Shard: "r1-0", HomeRegion: "r1", Partition: 7, Leader: "r1-1"}, true
	}
	c, err := console.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	api, err := server.New(server.Config{Backend: backend.NewMem(backend.MemConfig{}), Registry: reg,
		ExtraRoutes: map[string]http.Handler{"/ui/": c.Handler()}})
	if err != nil {
		t.Fatal(err)
	}
	outer = console.Sessions(authz.Middleware(api.HTTPHandler(), auth.JSONAPITarget, nil))
	s := &stack{srv: httptest.NewServer(outer)}
	t.Cleanup(s.srv.Close)
	return s
}

type reply struct {
	status int
	header http.Header
	body   string
}

// do sends a request as token; form, when set, is POSTed from this origin
// unless origin says otherwise.
func (s *stack) do(t *testing.T, token, method, path string, form url.Values, origin string) reply {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, s.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
	}
	if strings.HasPrefix(path, "/v1/") {
		req.Header.Set("Content-Type", "application/json")
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(data)}
}

func (s *stack) json(t *testing.T, method, path string, body any) map[string]any {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, s.srv.URL+path, strings.NewReader(string(data)))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return out
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func TestConsoleOverTheAPI(t *testing.T) {
	s := newStack(t)
	// A completed key whose stored body is markup.
	res := s.json(t, "POST", "/v1/namespaces/payments/keys/order-1:reserve", map[string]any{"fingerprint": "fp-1"})
	owner := res["owner_token"].(string)
	body := base64.StdEncoding.EncodeToString([]byte(`<script>window.pwned=1</script>{"paid":true}`))
	s.json(t, "POST", "/v1/namespaces/payments/keys/order-1:complete", map[string]any{"owner_token": owner,
		"response": map[string]any{"status": 201, "headers": map[string]string{"Content-Type": "text/html"}, "body": body}})

	t.Run("headers", func(t *testing.T) {
		r := s.do(t, adminToken, "GET", "/ui/keys/payments/order-1", nil, "")
		if r.status != 200 {
			t.Fatalf("key page: %d %s", r.status, r.body)
		}
		for h, want := range map[string]string{"X-Frame-Options": "DENY", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
			if got := r.header.Get(h); got != want {
				t.Errorf("%s: %q, want %q", h, got, want)
			}
		}
		csp := r.header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("CSP %q", csp)
		}
	})
	t.Run("stored markup is escaped", func(t *testing.T) {
		r := s.do(t, adminToken, "GET", "/ui/keys/payments/order-1", nil, "")
		if strings.Contains(r.body, "<script>window.pwned") || !strings.Contains(r.body, "&lt;script&gt;window.pwned=1&lt;/script&gt;") {
			t.Fatalf("the stored body is not shown escaped:\n%s", r.body)
		}
		if !strings.Contains(r.body, "replays the 201 stored at") || !strings.Contains(r.body, "another fingerprint gets FINGERPRINT_MISMATCH") {
			t.Fatalf("no sentence about the replay:\n%s", r.body)
		}
		if strings.Contains(r.body, owner) {
			t.Fatal("the key page shows the owner token")
		}
	})
	t.Run("no credentials", func(t *testing.T) {
		if r := s.do(t, "", "GET", "/ui/keys/payments/order-1", nil, ""); r.status != http.StatusSeeOther ||
			!strings.HasPrefix(r.header.Get("Location"), "/ui/login?next=") || strings.Contains(r.body, "fp-1") {
			t.Fatalf("a page without credentials: %d %q %s", r.status, r.header.Get("Location"), r.body)
		}
		if r := s.do(t, "", "GET", "/ui/stuck.json?older_than_s=0", nil, ""); r.status != http.StatusUnauthorized || strings.Contains(r.body, "payments") {
			t.Fatalf("the export without credentials: %d %s", r.status, r.body)
		}
		if r := s.do(t, "", "GET", "/ui/login", nil, ""); r.status != 200 || !strings.Contains(r.body, "not signed in") {
			t.Fatalf("the sign-in page: %d %s", r.status, r.body)
		}
	})
	t.Run("sign in", func(t *testing.T) {
		if r := s.do(t, "", "POST", "/ui/login", url.Values{"token": {"wrong"}}, s.srv.URL); r.status != http.StatusUnauthorized || r.header.Get("Set-Cookie") != "" {
			t.Fatalf("sign-in with a wrong token: %d %v", r.status, r.header)
		}
		if r := s.do(t, "", "POST", "/ui/login", url.Values{"token": {adminToken}}, "https://evil.example"); r.status != http.StatusForbidden || r.header.Get("Set-Cookie") != "" {
			t.Fatalf("cross-origin sign-in: %d", r.status)
		}
		r := s.do(t, "", "POST", "/ui/login", url.Values{"token": {adminToken}, "next": {"https://evil.example/"}}, s.srv.URL)
		ck := r.header.Get("Set-Cookie")
		if r.status != http.StatusSeeOther || r.header.Get("Location") != "/ui/keys" || !strings.Contains(ck, "HttpOnly") || !strings.Contains(ck, "SameSite=Strict") || !strings.Contains(ck, "Path=/ui/") {
			t.Fatalf("sign-in: %d Location %q cookie %q", r.status, r.header.Get("Location"), ck)
		}
		req, _ := http.NewRequest("GET", s.srv.URL+"/ui/keys/payments/order-1", nil)
		req.Header.Set("Cookie", strings.SplitN(ck, ";", 2)[0])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(data), "ops · admin") || !strings.Contains(string(data), "Sign out") {
			t.Fatalf("a page with the session cookie: %d\n%s", resp.StatusCode, data)
		}
		// The JSON API never reads the cookie.
		req, _ = http.NewRequest("GET", s.srv.URL+"/v1/namespaces/payments/keys/order-1", nil)
		req.Header.Set("Cookie", strings.SplitN(ck, ";", 2)[0])
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("the API with only the console's cookie: %v %v", resp.StatusCode, err)
		}
	})
	t.Run("reader of another namespace", func(t *testing.T) {
		r := s.do(t, readerToken, "GET", "/ui/keys/payments/order-1", nil, "")
		if r.status != http.StatusForbidden || strings.Contains(r.body, "FINGERPRINT_MISMATCH") || !strings.Contains(r.body, "PERMISSION_DENIED") {
			t.Fatalf("reader sees the key: %d\n%s", r.status, r.body)
		}
		r = s.do(t, readerToken, "GET", "/ui/stuck?older_than_s=0", nil, "")
		if strings.Contains(r.body, "payments") {
			t.Fatalf("reader's stuck view names payments:\n%s", r.body)
		}
		r = s.do(t, readerToken, "GET", "/ui/traffic.json", nil, "")
		if strings.Contains(r.body, "payments") {
			t.Fatalf("reader's traffic names payments: %s", r.body)
		}
	})

	// A stuck key, force-released through the console.
	res = s.json(t, "POST", "/v1/namespaces/payments/keys/stuck-1:reserve", map[string]any{"lease_ms": 600000})
	token := res["fencing_token"].(string)
	page := s.do(t, adminToken, "GET", "/ui/stuck?older_than_s=0", nil, "")
	if !strings.Contains(page.body, "stuck-1") {
		t.Fatalf("stuck view does not list stuck-1:\n%s", page.body)
	}
	m := csrfField.FindStringSubmatch(page.body)
	if m == nil {
		t.Fatal("no CSRF token in the admin's stuck view")
	}
	form := url.Values{"csrf": {m[1]}, "reason": {"stuck in test"}, "confirm": {"yes"}}
	path := "/ui/keys/payments/stuck-1/force-release"
	if r := s.do(t, adminToken, "POST", path, form, "https://evil.example"); r.status != http.StatusForbidden {
		t.Fatalf("cross-origin force-release: %d", r.status)
	}
	bad := url.Values{"csrf": {"forged"}, "reason": {"x"}, "confirm": {"yes"}}
	if r := s.do(t, adminToken, "POST", path, bad, s.srv.URL); r.status != http.StatusForbidden {
		t.Fatalf("force-release with a forged token: %d", r.status)
	}
	if r := s.do(t, readerToken, "POST", path, form, s.srv.URL); r.status == http.StatusSeeOther {
		t.Fatal("a reader's force-release (with the admin's token) went through")
	}
	if r := s.do(t, adminToken, "POST", path, form, s.srv.URL); r.status != http.StatusSeeOther || !strings.Contains(r.header.Get("Location"), token) {
		t.Fatalf("force-release: %d %s (Location %q)", r.status, r.body, r.header.Get("Location"))
	}
	if out := s.json(t, "POST", "/v1/namespaces/payments/keys/stuck-1:reserve", map[string]any{}); out["outcome"] != "RECLAIMED" {
		t.Fatalf("reserve after the console's force-release: %v", out)
	}

	// A policy the API refuses: its message is shown.
	m = csrfField.FindStringSubmatch(s.do(t, adminToken, "GET", "/ui/namespaces", nil, "").body)
	pol := url.Values{"csrf": {m[1]}, "default_lease_ms": {"5000"}, "max_lease_ms": {"1000"}}
	r := s.do(t, adminToken, "POST", "/ui/namespaces/payments/policy", pol, s.srv.URL)
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "INVALID_ARGUMENT") || !strings.Contains(r.body, "default_lease_ms") {
		t.Fatalf("refused policy: %d\n%s", r.status, r.body)
	}
}
