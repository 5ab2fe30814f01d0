package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/api/openapi"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/security/auth"
)

func tokenHash(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// secureAuthFile is the auth file of TestSecureRegion: alice (token) and
// bob (client certificate) write their own namespaces, reader only reads
// alice's, limited is held to 1 request per second, root is admin
// everywhere.
func secureAuthFile(extra string) string {
	return fmt.Sprintf(`principals:
  - name: alice
    token_sha256: %s
    namespaces: [alice]
    role: writer
  - name: bob
    namespaces: ["bob", "bob-*"]
    role: writer
  - name: reader
    token_sha256: %s
    namespaces: [alice]
    role: reader
  - name: limited
    token_sha256: %s
    namespaces: [lim]
    role: writer
    rate_per_s: 1
  - name: root
    namespaces: ["*"]
    role: admin
%s`, tokenHash("alice-token"), tokenHash("reader-token"), tokenHash("limited-token"), extra)
}

// TestSecureRegion runs a three-node region and a router in secure mode
// (certs dirs, one auth file) as real processes and checks the contract's
// "Security" section from outside: TLS only, every 401/403/429, tenant
// isolation, forwarding under mTLS with the principal checked again by the
// holder, open probes, forged Raft connections closed and counted, the Admin
// service's roles, and SIGHUP reloading the auth file (a bad one keeping
// the old).
func TestSecureRegion(t *testing.T) {
	dir := t.TempDir()
	topo, err := launch.Topology(launch.Spec{Cluster: "sec", Regions: []string{"r1"}, NodesPerRegion: 3, ShardsPerRegion: 3, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(authFile, []byte(secureAuthFile("")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Secure(authFile, "bob", "root", "stranger"); err != nil {
		t.Fatal(err)
	}
	rt, err := c.NewRouter(binaries.Path(t, "idemrouter"), "router-r1", "r1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.StopAll(); err != nil {
			t.Errorf("stopping the cluster: %v", err)
		}
		if t.Failed() {
			for _, p := range append([]*launch.Process{rt.Process}, c.Nodes["r1-1"], c.Nodes["r1-2"]) {
				data, _ := os.ReadFile(p.Log)
				if len(data) > 3000 {
					data = data[len(data)-3000:]
				}
				t.Logf("---- tail of %s ----\n%s", p.Name, data)
			}
		}
	})
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	api := func(addr, user, token string) *cluster.API {
		t.Helper()
		a, err := c.API(addr, user)
		if err != nil {
			t.Fatal(err)
		}
		a.Token = token
		return a
	}
	expect := func(what string, r cluster.Reply, status int, code string) cluster.Reply {
		t.Helper()
		if r.Status != status || (code != "" && r.ErrCode() != code) {
			t.Fatalf("%s: got %s, want %d %s", what, r, status, code)
		}
		return r
	}
	node1 := c.HTTPAddr("r1-1")
	entries := map[string]string{"router": rt.HTTPAddr, "node": node1}

	// TLS only: a plaintext request to a public listener gets no answer.
	if r, err := cluster.NewAPI(rt.HTTPAddr).Get(ctx, "alice", "k"); err == nil && r.Status < 400 {
		t.Fatalf("plaintext request to the router answered %s", r)
	}

	for name, addr := range entries {
		anon, stranger := api(addr, "", ""), api(addr, "stranger", "")
		alice, reader, bob := api(addr, "", "alice-token"), api(addr, "", "reader-token"), api(addr, "bob", "")
		key := "order-" + name

		// The probes need no credentials and reveal no record.
		for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
			expect(name+" "+p, must2(anon.Do(ctx, "GET", p, nil)), http.StatusOK, "")
		}
		// So does the OpenAPI document, which is the committed one.
		if doc := expect(name+" /openapi.json", must2(anon.Do(ctx, "GET", openapi.Path, nil)), http.StatusOK, ""); !bytes.Equal(doc.Raw, openapi.Document()) {
			t.Errorf("%s: GET /openapi.json is not the committed document (%d bytes)", name, len(doc.Raw))
		}

		// 401: nothing, an unknown token, a malformed header, a certificate
		// of a principal the file does not list.
		r := expect(name+" anonymous reserve", must2(anon.Reserve(ctx, "alice", key, map[string]any{})), 401, "UNAUTHENTICATED")
		if r.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", name)
		}
		expect(name+" unknown token", must2(api(addr, "", "wrong").Get(ctx, "alice", key)), 401, "UNAUTHENTICATED")
		expect(name+" unknown certificate", must2(stranger.Get(ctx, "alice", key)), 401, "UNAUTHENTICATED")

		// Allowed: alice reserves and completes in her namespace.
		acq := expect(name+" alice reserve", must2(alice.Reserve(ctx, "alice", key, map[string]any{"fingerprint": "a"})), 200, "")
		if acq.Str("outcome") != "ACQUIRED" {
			t.Fatalf("%s: alice reserve: %s", name, acq)
		}
		expect(name+" alice complete", must2(alice.Complete(ctx, "alice", key, map[string]any{
			"owner_token": acq.Str("owner_token"), "response": map[string]any{"status": 201, "body": "YWxpY2U="}})), 200, "")

		// 403: another namespace, a verb above the role, an admin action.
		expect(name+" alice on bob's namespace", must2(alice.Get(ctx, "bob", key)), 403, "PERMISSION_DENIED")
		expect(name+" reader reserves", must2(reader.Reserve(ctx, "alice", key+"-r", map[string]any{})), 403, "PERMISSION_DENIED")
		expect(name+" reader reads", must2(reader.Get(ctx, "alice", key)), 200, "")
		expect(name+" writer deletes", must2(alice.Do(ctx, "DELETE", cluster.KeyPath("alice", key), map[string]any{"reason": "x"})), 403, "PERMISSION_DENIED")

		// Tenant isolation: bob's same key is his own, and alice's record is
		// out of his reach.
		bacq := expect(name+" bob reserve same key", must2(bob.Reserve(ctx, "bob", key, map[string]any{"fingerprint": "a"})), 200, "")
		if bacq.Str("outcome") != "ACQUIRED" {
			t.Fatalf("%s: bob's reserve of the same key in his namespace: %s (want ACQUIRED, not alice's replay)", name, bacq)
		}
		expect(name+" bob reads alice", must2(bob.Get(ctx, "alice", key)), 403, "PERMISSION_DENIED")
		expect(name+" bob replays alice", must2(bob.Reserve(ctx, "alice", key, map[string]any{"fingerprint": "a"})), 403, "PERMISSION_DENIED")

		// A forwarded-principal header from a client is not honoured: a
		// token-less caller claiming to be root stays anonymous.
		forged := api(addr, "", "")
		forged.Client.Transport = headerTransport{base: forged.Client.Transport, h: auth.ForwardedPrincipalHeader, v: "root"}
		expect(name+" forged forwarded principal", must2(forged.Get(ctx, "alice", key)), 401, "UNAUTHENTICATED")

		// 429 with Retry-After past rate_per_s (1/s, burst 1).
		limited := api(addr, "", "limited-token")
		var got429 cluster.Reply
		for i := 0; i < 20 && got429.Status != 429; i++ {
			r := must2(limited.Get(ctx, "lim", "k"))
			if r.Status == 429 {
				got429 = r
			} else if r.Status != 404 {
				t.Fatalf("%s: limited GET: %s", name, r)
			}
		}
		if got429.Status != 429 || got429.ErrCode() != "RESOURCE_EXHAUSTED" || got429.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: no 429 with Retry-After in 20 requests of a 1/s principal (last %s)", name, got429)
		}
	}

	// Forwarding under mTLS: keys reserved through each node reach their
	// shard's leader (on another node for some: no node leads every shard
	// of the other nodes) as alice; the principal travelled and the holder
	// checked it (the 403s above came back from whichever node held the key).
	forwarded := 0
	for _, n := range topo.Regions[0].Nodes {
		a := api(n.HTTPAddr, "", "alice-token")
		for i := range 6 {
			r := expect("alice via "+n.ID, must2(a.Reserve(ctx, "alice", "fwd-"+n.ID+"-"+strconv.Itoa(i), map[string]any{})), 200, "")
			if r.Str("outcome") != "ACQUIRED" {
				t.Fatalf("reserve via %s: %s", n.ID, r)
			}
		}
		metrics := string(must2(api(n.HTTPAddr, "", "").Do(ctx, "GET", "/metrics", nil)).Raw)
		if strings.Contains(metrics, `idem_forward_requests_total{`) {
			forwarded++
		}
		if strings.Contains(metrics, "order-") || strings.Contains(metrics, "fwd-") {
			t.Errorf("/metrics of %s reveals keys", n.ID)
		}
	}
	if forwarded == 0 {
		t.Errorf("no node forwarded anything: no idem_forward_requests_total")
	}

	// gRPC: the same decisions, and the Admin service's roles.
	grpcConn := func(user string) *grpc.ClientConn {
		t.Helper()
		cfg, err := c.ClientTLS(user)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(rt.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	wantCode := func(what string, err error, code codes.Code) {
		t.Helper()
		if status.Code(err) != code {
			t.Fatalf("%s: %v, want %s", what, err, code)
		}
	}
	anonG, bobG := grpcConn(""), grpcConn("bob")
	_, err = idemv1.NewIdempotencyClient(anonG).Get(ctx, &idemv1.GetRequest{Namespace: "bob", Key: "k"})
	wantCode("gRPC anonymous Get", err, codes.Unauthenticated)
	_, err = idemv1.NewIdempotencyClient(bobG).Get(ctx, &idemv1.GetRequest{Namespace: "alice", Key: "order-router"})
	wantCode("gRPC bob Get alice", err, codes.PermissionDenied)
	_, err = idemv1.NewIdempotencyClient(bobG).Get(ctx, &idemv1.GetRequest{Namespace: "bob", Key: "order-router"})
	wantCode("gRPC bob Get bob", err, codes.OK)
	// A Batch through the router: the batch needs a known caller; each
	// operation is authorized as its unary RPC (bob's namespace yes,
	// alice's no), and forwarded to the nodes with bob's principal.
	_, err = idemv1.NewIdempotencyClient(anonG).Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{
		{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "bob", Key: "k"}}}}})
	wantCode("gRPC anonymous Batch", err, codes.Unauthenticated)
	batch, err := idemv1.NewIdempotencyClient(bobG).Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{
		{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "bob", Key: "order-router"}}},
		{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "alice", Key: "order-router"}}},
		{Op: &idemv1.BatchOp_Reserve{Reserve: &idemv1.ReserveRequest{Namespace: "bob", Key: "batched"}}},
		{Op: &idemv1.BatchOp_Reserve{Reserve: &idemv1.ReserveRequest{Namespace: "alice", Key: "batched"}}},
	}})
	if err != nil {
		t.Fatalf("gRPC bob Batch: %v", err)
	}
	if r := batch.GetResults(); len(r) != 4 || r[0].GetGet() == nil || r[2].GetReserve().GetOutcome() != idemv1.Outcome_ACQUIRED ||
		idemv1.BatchErrorStatus(r[1].GetError()).Code() != codes.PermissionDenied || idemv1.BatchErrorStatus(r[3].GetError()).Code() != codes.PermissionDenied {
		t.Fatalf("gRPC bob Batch: %v", batch)
	}
	nodeG, err := grpc.NewClient(topo.Regions[0].Nodes[0].GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(must2(c.ClientTLS("bob")))))
	if err != nil {
		t.Fatal(err)
	}
	defer nodeG.Close()
	_, err = idemv1.NewAdminClient(nodeG).Status(ctx, &idemv1.StatusRequest{})
	wantCode("Admin Status as bob", err, codes.PermissionDenied)
	rootNode, err := grpc.NewClient(topo.Regions[0].Nodes[0].GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(must2(c.ClientTLS("root")))))
	if err != nil {
		t.Fatal(err)
	}
	defer rootNode.Close()
	if _, err := idemv1.NewAdminClient(rootNode).Status(ctx, &idemv1.StatusRequest{}); err != nil {
		t.Fatalf("Admin Status as root: %v", err)
	}

	// The Go client: TLS config and token in its Config.
	ccfg := client.DefaultConfig(rt.GRPCAddr)
	ccfg.TLS, ccfg.Token, ccfg.MaxAttempts = must2(c.ClientTLS("")), "alice-token", 1
	gc, err := client.New(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	if res, err := gc.Reserve(ctx, client.ReserveRequest{Namespace: "alice", Key: "go-client"}); err != nil || res.Outcome != client.OutcomeAcquired {
		t.Fatalf("Go client reserve as alice: %+v %v", res, err)
	}
	if _, err := gc.Reserve(ctx, client.ReserveRequest{Namespace: "bob", Key: "go-client"}); status.Code(err) != codes.PermissionDenied && !strings.Contains(fmt.Sprint(err), "PERMISSION_DENIED") {
		t.Fatalf("Go client reserve in bob's namespace as alice: %v, want PERMISSION_DENIED", err)
	}

	// Forged Raft connections are closed before a Raft message is read:
	// plaintext with a valid mux header, and TLS with a client certificate.
	raftAddr := topo.Regions[0].Nodes[0].RaftAddr
	before := raftRejected(t, api(node1, "", ""))
	hdr := append([]byte("IDRM\x01"), byte(len("r1-0")))
	hdr = append(hdr, "r1-0"...)
	expectClosed(t, "plaintext", func() (net.Conn, error) { return net.DialTimeout("tcp", raftAddr, 5*time.Second) }, hdr)
	clientCfg := must2(c.ClientTLS("bob"))
	clientCfg.ServerName = "127.0.0.1"
	expectClosed(t, "client certificate", func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", raftAddr, clientCfg)
	}, hdr)
	deadline := time.Now().Add(10 * time.Second)
	for raftRejected(t, api(node1, "", "")) < before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("idem_raft_rejected_connections_total{reason=\"tls\"} went from %v to %v, want +2", before, raftRejected(t, api(node1, "", "")))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// SIGHUP reloads the auth file: a new principal works on every process
	// that reloaded; a file that does not parse keeps the old one.
	carol := "  - name: carol\n    token_sha256: " + tokenHash("carol-token") + "\n    namespaces: [carol]\n    role: reader\n"
	if err := os.WriteFile(authFile, []byte(secureAuthFile(carol)), 0o600); err != nil {
		t.Fatal(err)
	}
	hupAll := func() {
		for _, p := range append([]*launch.Process{rt.Process}, c.Nodes["r1-1"], c.Nodes["r1-2"], c.Nodes["r1-3"]) {
			if err := p.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		}
	}
	hupAll()
	carolAPI := api(rt.HTTPAddr, "", "carol-token")
	pollStatus(t, func() int { return must2(carolAPI.Get(ctx, "carol", "k")).Status }, 404)
	if err := os.WriteFile(authFile, []byte("principals: [ {name: "), 0o600); err != nil {
		t.Fatal(err)
	}
	hupAll()
	// The bad file is logged and the old principals stay.
	pollLog(t, rt.Process, "kept the previous files")
	expect("carol after a bad reload", must2(carolAPI.Get(ctx, "carol", "k")), 404, "NOT_FOUND")
	for _, p := range c.Nodes {
		if !p.Running() {
			t.Fatalf("%s exited after SIGHUP", p.Name)
		}
	}
}

func must2[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

type headerTransport struct {
	base http.RoundTripper
	h, v string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.h, h.v)
	return h.base.RoundTrip(r)
}

// expectClosed dials, sends data and expects the peer to close without
// sending anything (a failed TLS handshake counts: the dial fails).
func expectClosed(t *testing.T, what string, dial func() (net.Conn, error), data []byte) {
	t.Helper()
	conn, err := dial()
	if err != nil {
		return // the handshake was refused: nothing reached Raft
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	conn.Write(data)
	conn.Write(bytes.Repeat([]byte{0}, 64))
	buf := make([]byte, 1)
	if n, err := conn.Read(buf); err == nil || n > 0 {
		t.Fatalf("%s Raft connection: read %d bytes, err %v; want it closed", what, n, err)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s Raft connection still open after 10 s", what)
	}
}

func raftRejected(t *testing.T, a *cluster.API) float64 {
	t.Helper()
	m := must2(a.Do(context.Background(), "GET", "/metrics", nil))
	for _, line := range strings.Split(string(m.Raw), "\n") {
		if strings.HasPrefix(line, `idem_raft_rejected_connections_total{reason="tls"}`) {
			f, _ := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, ' '):]), 64)
			return f
		}
	}
	t.Fatal("no idem_raft_rejected_connections_total{reason=\"tls\"}")
	return 0
}

func pollStatus(t *testing.T, get func() int, want int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	last := 0
	for time.Now().Before(deadline) {
		if last = get(); last == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("status %d, want %d within 15 s", last, want)
}

func pollLog(t *testing.T, p *launch.Process, text string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		data, _ := os.ReadFile(p.Log)
		if bytes.Contains(data, []byte(text)) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s's log never said %q", p.Name, text)
}

// TestSecureRouterWithoutAuthFile: secure nodes with an auth file behind a
// secure router started without one. Anonymous callers get 401 at the
// router (reserve, GET and DELETE alike), and nothing reaches the nodes;
// a caller with a client certificate of the CA is forwarded as its name,
// which the nodes judge with their auth file. Before, the router made every
// caller root: an anonymous DELETE answered 200.
func TestSecureRouterWithoutAuthFile(t *testing.T) {
	c := newRootBobRegion(t, "noauth")
	r, err := c.NewRouter(binaries.Path(t, "idemrouter"), "edge", "r1")
	if err != nil {
		t.Fatal(err)
	}
	// The router without --auth-file.
	if i := slices.Index(r.Process.Args, "--auth-file"); i >= 0 {
		r.Process.Args = slices.Delete(r.Process.Args, i, i+2)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	root, err := c.API(r.HTTPAddr, "root")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := root.Reserve(ctx, "pay", "k1", nil); err != nil || res.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve with root's certificate: %v %v", res, err)
	}
	anon, err := c.API(r.HTTPAddr, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path string }{
		{"POST", cluster.KeyPath("pay", "k2") + ":reserve"},
		{"GET", cluster.KeyPath("pay", "k1")},
		{"DELETE", cluster.KeyPath("pay", "k1")},
	} {
		var body any
		if tc.method != "GET" {
			body = map[string]any{}
			if tc.method == "DELETE" {
				body = map[string]any{"reason": "anonymous"}
			}
		}
		res, err := anon.Do(ctx, tc.method, tc.path, body)
		if err != nil || res.Status != 401 {
			t.Fatalf("anonymous %s %s through a router without an auth file: %v %v, want 401", tc.method, tc.path, res, err)
		}
	}
	// bob's certificate is forwarded as bob: the nodes' auth file lets him
	// write his namespace and nothing else.
	bob, err := c.API(r.HTTPAddr, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := bob.Reserve(ctx, "bob", "k1", nil); err != nil || res.Str("outcome") != "ACQUIRED" {
		t.Fatalf("bob reserving in his namespace: %v %v", res, err)
	}
	if res, err := bob.Do(ctx, "DELETE", cluster.KeyPath("pay", "k1"), map[string]any{"reason": "bob"}); err != nil || res.Status != 403 {
		t.Fatalf("bob deleting in pay through the router: %v %v, want 403 from the nodes", res, err)
	}
	if g, err := root.Get(ctx, "pay", "k1"); err != nil || g.Str("state") != "IN_PROGRESS" {
		t.Fatalf("pay/k1 after the refused deletes: %v %v", g, err)
	}
}

// newRootBobRegion lays out a secure region (r1) of three nodes and one
// shard, not started, whose auth file lists root (admin on "*") and bob
// (writer on bob), each with a client certificate.
func newRootBobRegion(t *testing.T, name string) *cluster.Cluster {
	t.Helper()
	topo, err := launch.Topology(launch.Spec{Cluster: name, NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := cluster.NewNodes(topo, dir, binaries.Path(t, "idemnode"))
	if err != nil {
		t.Fatal(err)
	}
	authFile := filepath.Join(dir, "auth.yaml")
	if err := os.WriteFile(authFile, []byte("principals:\n  - {name: root, namespaces: [\"*\"], role: admin}\n  - {name: bob, namespaces: [bob], role: writer}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Secure(authFile, "root", "bob"); err != nil {
		t.Fatal(err)
	}
	return c
}
