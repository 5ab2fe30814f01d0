package auth

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/security/pki"
)

// testCerts is a CA with node certificates n1 (the server) and n2 (a
// forwarding peer) and client certificates in the CA's dir.
type testCerts struct {
	caDir  string
	n1, n2 *pki.Reloader
}

func newTestCerts(t *testing.T, clients ...string) *testCerts {
	t.Helper()
	tc := &testCerts{caDir: t.TempDir()}
	if err := pki.CreateCA(tc.caDir, pki.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		if err := pki.CreateClient(tc.caDir, "", c, pki.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	nodeReloader := func(id string) *pki.Reloader {
		dir := t.TempDir()
		b, _ := os.ReadFile(filepath.Join(tc.caDir, pki.CACertFile))
		os.WriteFile(filepath.Join(dir, pki.CACertFile), b, 0o644)
		if err := pki.CreateNode(dir, filepath.Join(tc.caDir, pki.CAKeyFile), id, []string{"127.0.0.1"}, pki.Options{}); err != nil {
			t.Fatal(err)
		}
		r, err := pki.NewReloader(pki.ReloaderConfig{Dir: dir, CheckInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	tc.n1, tc.n2 = nodeReloader("n1"), nodeReloader("n2")
	return tc
}

func (tc *testCerts) clientTLS(t *testing.T, name string) *tls.Config {
	t.Helper()
	c, err := pki.ClientTLS(tc.caDir, name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestHTTPMiddleware runs the middleware behind a real TLS listener, so the
// principal of a client certificate comes from the verified chain.
func TestHTTPMiddleware(t *testing.T) {
	certs := newTestCerts(t, "cert-only", "mallory")
	a, _, _ := newTestAuthorizer(t, testFile()) // frozen clock: the rate limit is exact
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := PrincipalFrom(r.Context())
		name := ""
		if p != nil {
			name = p.Name
		}
		w.Header().Set("X-Principal", name)
		w.Header().Set("X-Saw-Forwarded", r.Header.Get(ForwardedPrincipalHeader))
		w.WriteHeader(http.StatusOK)
	})
	srv := httptest.NewUnstartedServer(a.Middleware(inner, JSONAPITarget, nil))
	srv.TLS = certs.n1.PublicServerTLS()
	srv.StartTLS()
	t.Cleanup(srv.Close)
	client := func(cfg *tls.Config) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	anon := client(certs.clientTLS(t, ""))
	byCert := client(certs.clientTLS(t, "cert-only"))
	mallory := client(certs.clientTLS(t, "mallory"))
	byNode := client(certs.n2.NodeClientTLS("127.0.0.1"))
	t.Cleanup(func() {
		for _, c := range []*http.Client{anon, byCert, mallory, byNode} {
			c.CloseIdleConnections()
		}
	})

	for _, tc := range []struct {
		name          string
		c             *http.Client
		method, path  string
		token         string
		forwarded     string
		wantStatus    int
		wantPrincipal string
		wantCode      string
	}{
		{name: "probe needs nothing", c: anon, method: "GET", path: "/healthz", wantStatus: 200},
		{name: "metrics need nothing", c: anon, method: "GET", path: "/metrics", wantStatus: 200},
		{name: "the OpenAPI document needs nothing", c: anon, method: "GET", path: "/openapi.json", wantStatus: 200},
		{name: "no credentials", c: anon, method: "GET", path: "/v1/namespaces/billing/keys/k", wantStatus: 401, wantCode: CodeUnauthenticated},
		{name: "unknown path still needs credentials", c: anon, method: "GET", path: "/v2/x", wantStatus: 401, wantCode: CodeUnauthenticated},
		{name: "bad token", c: anon, method: "GET", path: "/v1/namespaces/billing/keys/k", token: "nope", wantStatus: 401, wantCode: CodeUnauthenticated},
		{name: "token", c: anon, method: "POST", path: "/v1/namespaces/billing/keys/k:reserve", token: "tok-billing", wantStatus: 200, wantPrincipal: "billing-api"},
		{name: "token, other namespace", c: anon, method: "GET", path: "/v1/namespaces/shop/keys/k", token: "tok-billing", wantStatus: 403, wantCode: CodePermissionDenied},
		{name: "reader reserves", c: anon, method: "POST", path: "/v1/namespaces/billing/keys/k:reserve", token: "tok-auditor", wantStatus: 403, wantCode: CodePermissionDenied},
		{name: "reader lists", c: anon, method: "GET", path: "/v1/namespaces/billing/keys?state=IN_PROGRESS", token: "tok-auditor", wantStatus: 200, wantPrincipal: "auditor"},
		{name: "writer deletes", c: anon, method: "DELETE", path: "/v1/namespaces/billing/keys/k", token: "tok-billing", wantStatus: 403, wantCode: CodePermissionDenied},
		{name: "client certificate", c: byCert, method: "POST", path: "/v1/namespaces/shop/keys/k:complete", wantStatus: 200, wantPrincipal: "cert-only"},
		{name: "client certificate, other namespace", c: byCert, method: "GET", path: "/v1/namespaces/billing/keys/k", wantStatus: 403, wantCode: CodePermissionDenied},
		{name: "client cannot forward", c: byCert, method: "GET", path: "/v1/namespaces/shop/keys/k", forwarded: "root", wantStatus: 200, wantPrincipal: "cert-only"},
		{name: "unlisted certificate", c: mallory, method: "GET", path: "/v1/namespaces/shop/keys/k", forwarded: "root", wantStatus: 401, wantCode: CodeUnauthenticated},
		{name: "node forwards a principal", c: byNode, method: "GET", path: "/v1/namespaces/billing/keys/k", forwarded: "auditor", wantStatus: 200, wantPrincipal: "auditor"},
		{name: "forwarded principal's role holds", c: byNode, method: "POST", path: "/v1/namespaces/billing/keys/k:reserve", forwarded: "auditor", wantStatus: 403, wantCode: CodePermissionDenied},
		{name: "node itself", c: byNode, method: "GET", path: "/v1/namespaces/any/keys/k", wantStatus: 200, wantPrincipal: "node:n2"},
		{name: "invalid namespace reaches the handler's 400", c: anon, method: "GET", path: "/v1/namespaces/Bad/keys/k", token: "tok-billing", wantStatus: 200, wantPrincipal: "billing-api"},
		// billing-api spent its burst of 2 above (403s spend nothing).
		{name: "rate limit: over", c: anon, method: "GET", path: "/v1/namespaces/billing/keys/k", token: "tok-billing", wantStatus: 429, wantCode: CodeResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			if tc.forwarded != "" {
				req.Header.Set(ForwardedPrincipalHeader, tc.forwarded)
			}
			resp, err := tc.c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.wantStatus)
			}
			if tc.wantCode == "" {
				if got := resp.Header.Get("X-Principal"); got != tc.wantPrincipal {
					t.Fatalf("principal %q, want %q", got, tc.wantPrincipal)
				}
				if tc.wantPrincipal != "" && tc.wantPrincipal != "auditor" && resp.Header.Get("X-Saw-Forwarded") != "" {
					t.Fatalf("the handler saw a forwarded header %q from a non-node", resp.Header.Get("X-Saw-Forwarded"))
				}
				return
			}
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error.Code != tc.wantCode || body.Error.Message == "" {
				t.Fatalf("body %+v, %v; want code %s", body, err, tc.wantCode)
			}
			if resp.Header.Get("X-Principal") != "" {
				t.Fatal("a refused request reached the handler")
			}
			if tc.wantStatus == 429 && resp.Header.Get("Retry-After") != "1" {
				t.Fatalf("Retry-After %q, want 1", resp.Header.Get("Retry-After"))
			}
			if tc.wantStatus == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
}

func TestForwardHTTP(t *testing.T) {
	out, _ := http.NewRequest("GET", "http://x/", nil)
	out.Header.Set(ForwardedPrincipalHeader, "spoofed")
	ForwardHTTP(WithPrincipal(context.Background(), &Principal{Name: "alice"}), out)
	if got := out.Header.Get(ForwardedPrincipalHeader); got != "alice" {
		t.Fatalf("forwarded %q, want alice", got)
	}
	ForwardHTTP(WithPrincipal(context.Background(), root), out)
	if got := out.Header.Get(ForwardedPrincipalHeader); got != "" {
		t.Fatalf("an internal principal was forwarded as %q", got)
	}
}

// idemStub answers Get with the principal's name as the fingerprint.
type idemStub struct {
	idemv1.UnimplementedIdempotencyServer
}

func (idemStub) Get(ctx context.Context, _ *idemv1.GetRequest) (*idemv1.GetResponse, error) {
	p, ok := PrincipalFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no principal in context")
	}
	return &idemv1.GetResponse{Fingerprint: p.Name}, nil
}

// TestGRPCInterceptors serves the Idempotency and Admin services over TLS on
// loopback with the interceptors, and calls them as clients, routers and
// nodes would.
func TestGRPCInterceptors(t *testing.T) {
	certs := newTestCerts(t, "cert-only")
	a, _, _ := newTestAuthorizer(t, testFile())
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(certs.n1.PublicServerTLS("h2"))),
		grpc.UnaryInterceptor(a.UnaryServerInterceptor(nil)),
		grpc.StreamInterceptor(a.StreamServerInterceptor(nil)),
	)
	idemv1.RegisterIdempotencyServer(srv, idemStub{})
	idemv1.RegisterAdminServer(srv, idemv1.UnimplementedAdminServer{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)

	dial := func(cfg *tls.Config, opts ...grpc.DialOption) *grpc.ClientConn {
		t.Helper()
		cc, err := grpc.NewClient(ln.Addr().String(), append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	anon := dial(certs.clientTLS(t, ""))
	billing := dial(certs.clientTLS(t, ""), grpc.WithPerRPCCredentials(client.BearerToken("tok-billing")))
	byCert := dial(certs.clientTLS(t, "cert-only"))
	byNode := dial(certs.n2.NodeClientTLS("127.0.0.1", "h2"), grpc.WithUnaryInterceptor(ForwardUnaryClientInterceptor()))

	get := func(cc *grpc.ClientConn, ctx context.Context, ns string) (string, error) {
		resp, err := idemv1.NewIdempotencyClient(cc).Get(ctx, &idemv1.GetRequest{Namespace: ns, Key: "k"})
		return resp.GetFingerprint(), err
	}
	auditor, _ := a.state.Load().policy.Lookup("auditor")
	spoofed := metadata.AppendToOutgoingContext(t.Context(), ForwardedPrincipalMetadata, "root")
	for _, tc := range []struct {
		name          string
		cc            *grpc.ClientConn
		ctx           context.Context
		ns            string
		wantCode      codes.Code
		wantPrincipal string
	}{
		{"no credentials", anon, t.Context(), "billing", codes.Unauthenticated, ""},
		{"token", billing, t.Context(), "billing", codes.OK, "billing-api"},
		{"token, other namespace", billing, t.Context(), "shop", codes.PermissionDenied, ""},
		{"client certificate", byCert, t.Context(), "shop", codes.OK, "cert-only"},
		{"client cannot forward", byCert, spoofed, "shop", codes.OK, "cert-only"},
		{"node forwards the caller's principal", byNode, WithPrincipal(t.Context(), auditor), "billing", codes.OK, "auditor"},
		{"node itself", byNode, t.Context(), "billing", codes.OK, "node:n2"},
		{"token, second of the burst", billing, t.Context(), "billing", codes.OK, "billing-api"},
		{"token, over the rate", billing, t.Context(), "billing", codes.ResourceExhausted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := get(tc.cc, tc.ctx, tc.ns)
			if st := status.Convert(err); st.Code() != tc.wantCode {
				t.Fatalf("code %v (%v), want %v", st.Code(), err, tc.wantCode)
			}
			if got != tc.wantPrincipal {
				t.Fatalf("principal %q, want %q", got, tc.wantPrincipal)
			}
			if tc.wantCode == codes.ResourceExhausted {
				var retry *errdetails.RetryInfo
				for _, d := range status.Convert(err).Details() {
					if r, ok := d.(*errdetails.RetryInfo); ok {
						retry = r
					}
				}
				if retry == nil || retry.GetRetryDelay().AsDuration() <= 0 {
					t.Fatalf("RESOURCE_EXHAUSTED without a RetryInfo: %v", status.Convert(err).Details())
				}
			}
		})
	}
	// Admin: a cluster-wide RPC needs admin on "*"; the stub answers
	// Unimplemented once authorization let the call through.
	if _, err := idemv1.NewAdminClient(billing).Status(t.Context(), &idemv1.StatusRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("writer calling Admin.Status: %v, want PermissionDenied", err)
	}
	if _, err := idemv1.NewAdminClient(byNode).Status(t.Context(), &idemv1.StatusRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("node calling Admin.Status: %v, want it past authorization (Unimplemented)", err)
	}
	// A token never crosses a plaintext link.
	if !client.BearerToken("x").RequireTransportSecurity() {
		t.Fatal("BearerToken allows plaintext")
	}
	var e *Error
	if _, err := a.Authorize(Credentials{}, Target{"billing", VerbGet}); !errors.As(err, &e) || status.Code(e.GRPCStatus().Err()) != codes.Unauthenticated {
		t.Fatalf("GRPCStatus of a 401: %v", err)
	}
}

func TestJSONAPITarget(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		want         Target
		needAuth     bool
	}{
		{"GET", "/healthz", Target{}, false},
		{"GET", "/readyz", Target{}, false},
		// The console's sign-in page and static files; nothing else of it.
		{"GET", "/ui/login", Target{}, false},
		{"POST", "/ui/login", Target{}, false},
		{"GET", "/ui/static/console.js", Target{}, false},
		{"GET", "/ui/static/../keys/pay/k", Target{Verb: VerbAuthenticate}, true},
		{"GET", "/ui/static/%2e%2e/keys/pay/k", Target{Verb: VerbAuthenticate}, true},
		{"GET", "/ui/keys/pay/k", Target{Verb: VerbAuthenticate}, true},
		{"POST", "/ui/logout", Target{Verb: VerbAuthenticate}, true},
		{"GET", "/v1/namespaces/pay/keys/k1", Target{"pay", VerbGet}, true},
		{"GET", "/v1/namespaces/pay/keys", Target{"pay", VerbList}, true},
		{"POST", "/v1/namespaces/pay/keys", Target{"pay", VerbUnknown}, true},
		{"POST", "/v1/namespaces/pay/keys/a:b:reserve", Target{"pay", VerbReserve}, true},
		{"POST", "/v1/namespaces/pay/keys/k:heartbeat", Target{"pay", VerbHeartbeat}, true},
		{"POST", "/v1/namespaces/pay/keys/k:complete", Target{"pay", VerbComplete}, true},
		{"POST", "/v1/namespaces/pay/keys/k:release", Target{"pay", VerbRelease}, true},
		{"POST", "/v1/namespaces/pay/keys/k:force-release", Target{"pay", VerbForceRelease}, true},
		{"DELETE", "/v1/namespaces/pay/keys/k", Target{"pay", VerbDelete}, true},
		{"POST", "/v1/namespaces/pay/keys/k:explode", Target{"pay", VerbUnknown}, true},
		{"PUT", "/v1/namespaces/pay/keys/k", Target{"pay", VerbUnknown}, true},
		{"POST", "/v1/namespaces/pay/keys/k", Target{"pay", VerbUnknown}, true},
		{"GET", "/v1/namespaces/Pay/keys/k", Target{Verb: VerbAuthenticate}, true},
		{"GET", "/v1/namespaces/p%61y/keys/k", Target{"pay", VerbGet}, true},
		{"GET", "/v1/namespaces/pay/keys/a/b", Target{Verb: VerbAuthenticate}, true},
		{"GET", "/", Target{Verb: VerbAuthenticate}, true},
		// The cluster's topology: any known caller reads it, only admin
		// on "*" changes it.
		{"GET", "/v1/topology", Target{Verb: VerbAuthenticate}, true},
		{"PUT", "/v1/topology", Target{Verb: VerbTopology}, true},
		{"POST", "/v1/topology", Target{Verb: VerbTopology}, true},
	} {
		r := httptest.NewRequest(tc.method, tc.path, nil)
		got, need := JSONAPITarget(r)
		if got != tc.want || need != tc.needAuth {
			t.Errorf("%s %s = %+v, %v; want %+v, %v", tc.method, tc.path, got, need, tc.want, tc.needAuth)
		}
	}
	if got := GRPCTarget("/idem.v1.Idempotency/Reserve", &idemv1.ReserveRequest{Namespace: "pay"}); got != (Target{"pay", VerbReserve}) {
		t.Errorf("GRPCTarget Reserve = %+v", got)
	}
	if got := GRPCTarget("/idem.v1.Admin/Snapshot", &idemv1.SnapshotRequest{}); got != (Target{Verb: VerbSnapshot}) {
		t.Errorf("GRPCTarget Snapshot = %+v", got)
	}
	for method, want := range map[string]Verb{"Get": VerbAuthenticate, "SetTarget": VerbTopology, "ShardState": VerbTopology, "ChangeMember": VerbTopology} {
		if got := GRPCTarget("/idem.v1.Topology/"+method, nil); got != (Target{Verb: want}) || !want.Cluster() && want != VerbAuthenticate {
			t.Errorf("GRPCTarget Topology/%s = %+v, want %s", method, got, want)
		}
	}
	if VerbTopology.MinRole() != RoleAdmin || !VerbTopology.Cluster() {
		t.Errorf("topology changes need admin on \"*\": min role %s, cluster %v", VerbTopology.MinRole(), VerbTopology.Cluster())
	}
	if got := GRPCTarget("/idem.v1.Admin/Rebalance", nil); got.Verb != VerbUnknown || !strings.Contains(string(got.Verb), "unknown") {
		t.Errorf("an unknown RPC = %+v, want VerbUnknown (fail closed)", got)
	}
}
