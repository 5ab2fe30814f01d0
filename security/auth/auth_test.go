package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/security/pki"
)

func tokenHash(tok string) string {
	s := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(s[:])
}

// testFile is the contract's example, plus principals for each case.
func testFile() string {
	return fmt.Sprintf(`principals:
  - name: billing-api
    token_sha256: %s
    namespaces: [billing, "billing-*"]
    role: writer
    rate_per_s: 2
  - name: auditor
    token_sha256: %s
    namespaces: ["*"]
    role: reader
  - name: ops
    token_sha256: %s
    namespaces: ["billing-*"]
    role: admin
  - name: root
    namespaces: ["*"]
    role: admin
  - name: cert-only
    namespaces: [shop]
    role: writer
`, tokenHash("tok-billing"), tokenHash("tok-auditor"), tokenHash("tok-ops"))
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "auth.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func newTestAuthorizer(t *testing.T, body string) (*Authorizer, *clock, string) {
	t.Helper()
	path := writeFile(t, body)
	clk := &clock{now: time.Unix(1_800_000_000, 0)}
	a, err := New(Config{File: path, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return a, clk, path
}

func bearer(tok string) Credentials { return Credentials{Authorization: "Bearer " + tok} }
func cert(name string) Credentials {
	return Credentials{Peer: pki.Identity{Kind: pki.KindClient, Name: name}}
}
func node(id, forwarded string) Credentials {
	return Credentials{Peer: pki.Identity{Kind: pki.KindNode, Name: id}, Forwarded: forwarded}
}

// TestAuthorizeContractCases is the contract's "Principals, namespaces and
// roles" as a table: every 401, 403 and allowed case.
func TestAuthorizeContractCases(t *testing.T) {
	a, clk, _ := newTestAuthorizer(t, testFile())
	for _, tc := range []struct {
		name      string
		creds     Credentials
		target    Target
		wantCode  string // "" means allowed
		wantPrinc string
	}{
		// 401 UNAUTHENTICATED: none or an unknown principal.
		{"no credentials", Credentials{}, Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"unknown token", bearer("guess"), Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"token of a principal without token_sha256", bearer(""), Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"not a bearer scheme", Credentials{Authorization: "Basic YWxpY2U6cHc="}, Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"bearer without a token", Credentials{Authorization: "Bearer "}, Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"client cert of an unlisted principal", cert("mallory"), Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"cert and token of different principals", Credentials{Peer: pki.Identity{Kind: pki.KindClient, Name: "cert-only"}, Authorization: "Bearer tok-billing"}, Target{"shop", VerbGet}, CodeUnauthenticated, ""},
		{"node forwarding an unknown principal", node("n1", "mallory"), Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"a client cannot forward", Credentials{Peer: pki.Identity{Kind: pki.KindClient, Name: "mallory"}, Forwarded: "root"}, Target{"billing", VerbGet}, CodeUnauthenticated, ""},
		{"an unknown verb still needs credentials", Credentials{}, Target{Verb: VerbAuthenticate}, CodeUnauthenticated, ""},
		{"Idempotency.Routing needs credentials", Credentials{}, GRPCTarget("/idem.v1.Idempotency/Routing", nil), CodeUnauthenticated, ""},

		// 403 PERMISSION_DENIED: namespace outside the list, verb above the role.
		{"writer outside its namespaces", bearer("tok-billing"), Target{"shop", VerbGet}, CodePermissionDenied, ""},
		{"prefix does not match", bearer("tok-billing"), Target{"billingx", VerbReserve}, CodePermissionDenied, ""},
		{"exact name is not a prefix", cert("cert-only"), Target{"shop-eu", VerbReserve}, CodePermissionDenied, ""},
		{"reader reserves", bearer("tok-auditor"), Target{"billing", VerbReserve}, CodePermissionDenied, ""},
		{"reader completes", bearer("tok-auditor"), Target{"billing", VerbComplete}, CodePermissionDenied, ""},
		{"writer force-releases", bearer("tok-billing"), Target{"billing", VerbForceRelease}, CodePermissionDenied, ""},
		{"writer deletes", bearer("tok-billing"), Target{"billing", VerbDelete}, CodePermissionDenied, ""},
		{"admin outside its namespaces", bearer("tok-ops"), Target{"billing", VerbForceRelease}, CodePermissionDenied, ""},
		{"namespace admin transfers leadership", bearer("tok-ops"), Target{Verb: VerbTransferLeader}, CodePermissionDenied, ""},
		{"reader on * asks Admin.Status", bearer("tok-auditor"), Target{Verb: VerbStatus}, CodePermissionDenied, ""},
		{"unclassified request fails closed", bearer("tok-auditor"), Target{"billing", VerbUnknown}, CodePermissionDenied, ""},
		{"forwarded principal keeps its own rights", node("n1", "billing-api"), Target{"shop", VerbGet}, CodePermissionDenied, ""},

		// Allowed.
		{"writer, exact namespace", bearer("tok-billing"), Target{"billing", VerbReserve}, "", "billing-api"},
		{"writer, prefix namespace", bearer("tok-billing"), Target{"billing-eu", VerbRelease}, "", "billing-api"},
		{"scheme is case-insensitive", Credentials{Authorization: "bearer tok-auditor"}, Target{"x", VerbGet}, "", "auditor"},
		{"reader lists", bearer("tok-auditor"), Target{"anything", VerbList}, "", "auditor"},
		{"admin force-releases on its namespaces", bearer("tok-ops"), Target{"billing-eu", VerbForceRelease}, "", "ops"},
		{"admin deletes on its namespaces", bearer("tok-ops"), Target{"billing-eu", VerbDelete}, "", "ops"},
		{"client certificate", cert("cert-only"), Target{"shop", VerbComplete}, "", "cert-only"},
		{"cert and token of the same principal", Credentials{Peer: pki.Identity{Kind: pki.KindClient, Name: "billing-api"}, Authorization: "Bearer tok-billing"}, Target{"billing", VerbGet}, "", "billing-api"},
		{"root transfers leadership", cert("root"), Target{Verb: VerbSnapshot}, "", "root"},
		{"a known principal passes an authenticate-only request", bearer("tok-billing"), Target{Verb: VerbAuthenticate}, "", "billing-api"},
		{"node peer", node("n1", ""), Target{Verb: VerbStatus}, "", "node:n1"},
		{"reader of one namespace asks Idempotency.Routing", bearer("tok-auditor"), GRPCTarget("/idem.v1.Idempotency/Routing", nil), "", "auditor"},
		{"writer of its namespaces asks Idempotency.Routing", cert("cert-only"), GRPCTarget("/idem.v1.Idempotency/Routing", &idemv1.RoutingRequest{}), "", "cert-only"},
		{"node forwarding a principal", node("n1", "billing-api"), Target{"billing", VerbReserve}, "", "billing-api"},
	} {
		clk.now = clk.now.Add(time.Second) // the rate limit is TestRateLimit's
		t.Run(tc.name, func(t *testing.T) {
			p, err := a.Authorize(tc.creds, tc.target)
			if tc.wantCode == "" {
				if err != nil {
					t.Fatalf("denied: %v", err)
				}
				if p.Name != tc.wantPrinc {
					t.Fatalf("principal %q, want %q", p.Name, tc.wantPrinc)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != tc.wantCode {
				t.Fatalf("got %v (principal %v), want %s", err, p, tc.wantCode)
			}
			if e.Message == "" {
				t.Fatal("a refusal without a message")
			}
			if want := map[string]int{CodeUnauthenticated: 401, CodePermissionDenied: 403}[tc.wantCode]; e.HTTPStatus() != want {
				t.Fatalf("HTTP status %d, want %d", e.HTTPStatus(), want)
			}
		})
	}
	s := a.Stats()
	if s.Unauthenticated == 0 || s.PermissionDenied == 0 || s.Allowed == 0 || !s.Enabled || s.Principals != 5 {
		t.Fatalf("stats %+v", s)
	}
}

// TestRateLimit: rate_per_s 2 gives a burst of 2, then 429 with a retry
// hint; tokens come back with time; denied requests do not spend tokens;
// forwarded requests are not charged again.
func TestRateLimit(t *testing.T) {
	a, clk, _ := newTestAuthorizer(t, testFile())
	ok := func(c Credentials) error { _, err := a.Authorize(c, Target{"billing", VerbReserve}); return err }
	for i := range 2 {
		if err := ok(bearer("tok-billing")); err != nil {
			t.Fatalf("request %d within the burst: %v", i, err)
		}
	}
	err := ok(bearer("tok-billing"))
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeResourceExhausted || !errors.Is(err, ErrRateLimited) {
		t.Fatalf("third request: %v, want RESOURCE_EXHAUSTED", err)
	}
	if e.RetryAfter <= 0 || e.RetryAfter > time.Second || e.RetryAfterSeconds() != 1 || e.HTTPStatus() != 429 {
		t.Fatalf("retry hint %v (%d s), status %d", e.RetryAfter, e.RetryAfterSeconds(), e.HTTPStatus())
	}
	// A 403 of the same principal spends nothing and stays a 403.
	if _, err := a.Authorize(bearer("tok-billing"), Target{"shop", VerbGet}); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("denied request while limited: %v", err)
	}
	// Forwarded by a node: the edge charged it already.
	if err := ok(node("n1", "billing-api")); err != nil {
		t.Fatalf("forwarded request: %v", err)
	}
	// Other principals are not affected.
	if _, err := a.Authorize(bearer("tok-auditor"), Target{"billing", VerbGet}); err != nil {
		t.Fatalf("another principal: %v", err)
	}
	clk.now = clk.now.Add(500 * time.Millisecond)
	if err := ok(bearer("tok-billing")); err != nil {
		t.Fatalf("after half a second (one token back): %v", err)
	}
	if err := ok(bearer("tok-billing")); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("right after: %v, want rate limited", err)
	}
	if s := a.Stats(); s.RateLimited != 2 {
		t.Fatalf("RateLimited %d, want 2", s.RateLimited)
	}
}

func TestNoAuthFileEveryoneIsRoot(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []Credentials{{}, bearer("anything"), cert("mallory")} {
		p, err := a.Authorize(c, Target{Verb: VerbTransferLeader})
		if err != nil || p.Name != "root" {
			t.Fatalf("without an auth file %+v got %v, %v; want root", c, p, err)
		}
	}
	if a.Enabled() || a.Reload() != nil {
		t.Fatal("an authorizer without a file is enabled or fails to reload")
	}
}

// TestSecureWithoutAuthFile: a secure process without an auth file accepts
// only client certificates of the CA (as their name, admin on "*") and node
// peers (with the principal they forward, or as themselves); an anonymous
// caller or a bearer token gets 401, so a router without an auth file can
// no longer make its callers root at the nodes.
func TestSecureWithoutAuthFile(t *testing.T) {
	a, err := New(Config{RequireCertificate: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c        Credentials
		want     string // principal, "" for 401
		internal bool
	}{
		{Credentials{}, "", false},
		{bearer("anything"), "", false},
		{cert("alice"), "alice", false},
		{node("edge-1", "alice"), "alice", false},
		{node("edge-1", ""), "node:edge-1", true},
	} {
		p, err := a.Authorize(tc.c, Target{Namespace: "pay", Verb: VerbDelete})
		switch {
		case tc.want == "":
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeUnauthenticated {
				t.Errorf("%+v: got %v, %v; want 401", tc.c, p, err)
			}
		case err != nil || p.Name != tc.want || p.Internal != tc.internal:
			t.Errorf("%+v: got %+v, %v; want %s", tc.c, p, err, tc.want)
		}
	}
}

func TestReload(t *testing.T) {
	a, _, path := newTestAuthorizer(t, testFile())
	if _, err := a.Authorize(bearer("tok-billing"), Target{"shop", VerbGet}); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("before reload: %v", err)
	}
	// Spend billing-api's burst; a reload that keeps its rate keeps the bucket.
	a.Authorize(bearer("tok-billing"), Target{"billing", VerbGet})
	a.Authorize(bearer("tok-billing"), Target{"billing", VerbGet})
	updated := strings.Replace(testFile(), "namespaces: [billing, \"billing-*\"]", "namespaces: [billing, \"billing-*\", shop]", 1)
	os.WriteFile(path, []byte(updated), 0o600)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authorize(bearer("tok-billing"), Target{"shop", VerbGet}); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("after reload: %v, want the carried-over bucket to be empty (rate limited)", err)
	}
	if _, err := a.Authorize(bearer("tok-ops"), Target{"billing-x", VerbGet}); err != nil {
		t.Fatalf("after reload: %v", err)
	}
	// A broken file keeps the policy in force and says why.
	os.WriteFile(path, []byte("principals:\n  - name: x\n    role: superuser\n    namespaces: [a]\n"), 0o600)
	err := a.Reload()
	if !errors.Is(err, ErrInvalidFile) || !strings.Contains(err.Error(), "superuser") {
		t.Fatalf("reload of a bad file: %v", err)
	}
	if _, err := a.Authorize(bearer("tok-ops"), Target{"billing-x", VerbGet}); err != nil {
		t.Fatalf("after a failed reload the old principals must stay: %v", err)
	}
	os.Remove(path)
	if err := a.Reload(); !errors.Is(err, ErrInvalidFile) {
		t.Fatalf("reload of a missing file: %v", err)
	}
	if s := a.Stats(); s.Reloads != 1 || s.ReloadFailures != 2 {
		t.Fatalf("stats %+v, want 1 reload and 2 failures", s)
	}
	if _, err := New(Config{File: path}); !errors.Is(err, ErrInvalidFile) {
		t.Fatalf("New with a missing file: %v", err)
	}
}

func TestParse(t *testing.T) {
	h := tokenHash("t")
	for _, tc := range []struct {
		name, body, want string // want: substring of the error; "" means valid
	}{
		{"contract example", testFile(), ""},
		{"JSON", `{"principals": [{"name": "a", "namespaces": ["*"], "role": "admin", "rate_per_s": 0.5}]}`, ""},
		{"empty", "", "empty"},
		{"no principals", "principals: []\n", "no principals"},
		{"unknown field", "principals:\n  - name: a\n    role: admin\n    namespaces: ['*']\n    password: x\n", "password"},
		{"bad role", "principals:\n  - name: a\n    role: owner\n    namespaces: ['*']\n", `role "owner"`},
		{"missing role", "principals:\n  - name: a\n    namespaces: ['*']\n", `role ""`},
		{"no namespaces", "principals:\n  - name: a\n    role: reader\n", "namespaces is empty"},
		{"bad namespace", "principals:\n  - name: a\n    role: reader\n    namespaces: [Billing]\n", `namespace "Billing"`},
		{"star inside", "principals:\n  - name: a\n    role: reader\n    namespaces: ['bil*ling']\n", `"bil*ling"`},
		{"bad prefix", "principals:\n  - name: a\n    role: reader\n    namespaces: ['-*']\n", `prefix "-*"`},
		{"bad name", "principals:\n  - name: 'a b'\n    role: reader\n    namespaces: [x]\n", "name must be"},
		{"duplicate name", "principals:\n  - {name: a, role: reader, namespaces: [x]}\n  - {name: a, role: reader, namespaces: [y]}\n", "listed twice"},
		{"short token hash", "principals:\n  - {name: a, role: reader, namespaces: [x], token_sha256: abc}\n", "64 hex digits"},
		{"duplicate token", fmt.Sprintf("principals:\n  - {name: a, role: reader, namespaces: [x], token_sha256: %s}\n  - {name: b, role: reader, namespaces: [x], token_sha256: %s}\n", h, strings.ToUpper(h)), "same token_sha256"},
		{"negative rate", "principals:\n  - {name: a, role: reader, namespaces: [x], rate_per_s: -1}\n", "rate_per_s"},
		{"two documents", "principals:\n  - {name: a, role: reader, namespaces: [x]}\n---\nprincipals: []\n", "more than one YAML document"},
		{"not a mapping", "- a\n- b\n", "invalid auth file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.body))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidFile) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrInvalidFile mentioning %q", err, tc.want)
			}
		})
	}
	// Every problem at once.
	_, err := Parse([]byte("principals:\n  - {name: 'a b', role: x, namespaces: []}\n"))
	if err == nil || strings.Count(err.Error(), "\n") < 2 {
		t.Fatalf("want three problems reported together, got %v", err)
	}
}

func router(name, forwarded string) Credentials {
	return Credentials{Peer: pki.Identity{Kind: pki.KindRouter, Name: name}, Forwarded: forwarded}
}

// TestRouterIdentityOnlyRoutes: a router that forwards no principal may
// route, read the status, and read and write records (its proxy mode's
// calls); a topology change, an operator action or a policy change needs
// the principal of the caller it forwards (with and without an auth file).
func TestRouterIdentityOnlyRoutes(t *testing.T) {
	withFile, _, _ := newTestAuthorizer(t, testFile())
	noFile, err := New(Config{RequireCertificate: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, a := range map[string]*Authorizer{"auth file": withFile, "no auth file": noFile} {
		for _, tc := range []struct {
			target  Target
			allowed bool
		}{
			{GRPCTarget("/idem.v1.Idempotency/Routing", nil), true},
			{GRPCTarget("/idem.v1.Topology/Get", nil), true},
			{GRPCTarget("/idem.v1.Admin/Status", nil), true},
			{GRPCTarget("/idem.v1.Topology/SetTarget", nil), false},
			{GRPCTarget("/idem.v1.Topology/ChangeMember", nil), false},
			{GRPCTarget("/idem.v1.Admin/Snapshot", nil), false},
			{GRPCTarget("/idem.v1.Admin/TransferLeader", nil), false},
			{Target{"billing", VerbForceRelease}, false},
			{Target{"billing", VerbDelete}, false},
			{Target{"billing", VerbSetPolicy}, false},
			{Target{"billing", VerbReserve}, true},
			{Target{"billing", VerbGet}, true},
		} {
			p, err := a.Authorize(router("edge-1", ""), tc.target)
			if tc.allowed != (err == nil) {
				t.Errorf("%s: router without a principal, %v: allowed %v, want %v (%v)", name, tc.target, err == nil, tc.allowed, err)
			}
			if err != nil && !strings.Contains(err.Error(), "router:edge-1") {
				t.Errorf("%s: the refusal does not name the router: %v", name, err)
			}
			if err == nil && p.Name != "router:edge-1" {
				t.Errorf("%s: principal %q", name, p.Name)
			}
		}
		// What the router forwards keeps the caller's rights.
		if p, err := a.Authorize(router("edge-1", "root"), Target{Verb: VerbTopology}); err != nil || p.Name != "root" {
			t.Errorf("%s: router forwarding root, topology: %v %v", name, p, err)
		}
	}
}

// TestNodeOutsideTheTopologyIsNoNode: once a node set its membership, a
// node certificate of an id outside it gets none of a node's rights: its
// own identity is a router's (what it forwards is judged as the forwarded
// principal, as from a router); a member keeps its rights.
func TestNodeOutsideTheTopologyIsNoNode(t *testing.T) {
	a, _, _ := newTestAuthorizer(t, testFile())
	if _, err := a.Authorize(node("evil-9", ""), Target{Verb: VerbTopology}); err != nil {
		t.Fatalf("without a membership every node certificate is a node: %v", err)
	}
	a.SetNodeMembership(func(id string) bool { return id == "n1" })
	for _, tgt := range []Target{{Verb: VerbTopology}, {Verb: VerbSnapshot}, GRPCTarget("/idem.v1.Topology/ChangeMember", nil), {"billing", VerbForceRelease}, {"billing", VerbSetPolicy}} {
		_, err := a.Authorize(node("evil-9", ""), tgt)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodePermissionDenied {
			t.Fatalf("node evil-9 on its own, %v: %v, want PERMISSION_DENIED", tgt, err)
		}
	}
	if p, err := a.Authorize(node("evil-9", ""), GRPCTarget("/idem.v1.Idempotency/Routing", nil)); err != nil || p.Name != "node:evil-9" {
		t.Fatalf("node evil-9 routing: %v %v", p, err)
	}
	if _, err := a.Authorize(node("evil-9", "billing-api"), Target{"shop", VerbGet}); err == nil {
		t.Fatal("a forwarded principal kept more than its own rights")
	}
	if p, err := a.Authorize(node("n1", ""), Target{Verb: VerbTopology}); err != nil || p.Name != "node:n1" {
		t.Fatalf("member n1: %v %v", p, err)
	}
}
