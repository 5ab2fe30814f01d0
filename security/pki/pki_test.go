package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newCA makes a certs dir with a CA and returns it.
func newCA(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := CreateCA(dir, Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// nodeDir copies ca.crt of caDir into a fresh dir and issues a node
// certificate there, signed with caDir's key.
func nodeDir(t *testing.T, caDir, id string) string {
	t.Helper()
	dir := t.TempDir()
	copyFile(t, filepath.Join(caDir, CACertFile), filepath.Join(dir, CACertFile))
	if err := CreateNode(dir, filepath.Join(caDir, CAKeyFile), id, []string{"127.0.0.1", "localhost"}, Options{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readLeaf(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	certs, err := readCerts(path)
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

func TestCreateCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := CreateCA(dir, Options{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, CAKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key mode %v, %v; want 0600", fi.Mode(), err)
	}
	ca := readLeaf(t, filepath.Join(dir, CACertFile))
	if !ca.IsCA || !ca.MaxPathLenZero || ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("CA certificate: IsCA=%v MaxPathLenZero=%v usage=%v", ca.IsCA, ca.MaxPathLenZero, ca.KeyUsage)
	}
	before, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err := CreateCA(dir, Options{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second CreateCA: %v, want ErrExists", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if string(before) != string(after) {
		t.Fatal("a refused CreateCA changed ca.key")
	}
	// Only the key left (the certificate lost): still refused.
	os.Remove(filepath.Join(dir, CACertFile))
	if err := CreateCA(dir, Options{}); !errors.Is(err, ErrExists) {
		t.Fatalf("CreateCA over a lone ca.key: %v, want ErrExists", err)
	}
}

func TestCreateNodeAndClient(t *testing.T) {
	dir := newCA(t)
	if err := CreateNode(dir, "", "us-east-1", []string{"127.0.0.1", "::1", "node1.example.com"}, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := CreateClient(dir, "", "billing-api", Options{}); err != nil {
		t.Fatal(err)
	}
	ca := readLeaf(t, filepath.Join(dir, CACertFile))
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	node := readLeaf(t, filepath.Join(dir, NodeCertFile))
	if _, err := node.Verify(x509.VerifyOptions{Roots: pool, DNSName: "node1.example.com", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("node cert does not verify as server for its DNS name: %v", err)
	}
	if err := node.VerifyHostname("::1"); err != nil {
		t.Fatalf("node cert not valid for ::1: %v", err)
	}
	if err := node.VerifyHostname("other.example.com"); err == nil {
		t.Fatal("node cert valid for a host it was not issued for")
	}
	if id, err := IdentifyNode(node); err != nil || id != (Identity{KindNode, "us-east-1"}) {
		t.Fatalf("IdentifyNode(node) = %v, %v", id, err)
	}
	client := readLeaf(t, filepath.Join(dir, ClientCertFile("billing-api")))
	if _, err := client.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client cert does not verify: %v", err)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Fatal("client cert verifies for server usage")
	}
	if id, err := Identify(client); err != nil || id != (Identity{KindClient, "billing-api"}) {
		t.Fatalf("Identify(client) = %v, %v", id, err)
	}
	if _, err := IdentifyNode(client); !errors.Is(err, ErrNotNode) {
		t.Fatalf("IdentifyNode(client) = %v, want ErrNotNode", err)
	}
	if _, err := Identify(ca); !errors.Is(err, ErrNotIdem) {
		t.Fatalf("Identify(CA) = %v, want ErrNotIdem", err)
	}
	for _, f := range []string{NodeKeyFile, ClientKeyFile("billing-api")} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v, %v; want 0600", f, fi.Mode(), err)
		}
	}
	if err := CreateNode(dir, "", "us-east-2", []string{"127.0.0.1"}, Options{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second CreateNode in one dir: %v, want ErrExists", err)
	}
	if err := CreateClient(dir, "", "billing-api", Options{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second CreateClient: %v, want ErrExists", err)
	}
}

func TestIssueErrors(t *testing.T) {
	dir := newCA(t)
	elsewhere := t.TempDir()
	copyFile(t, filepath.Join(dir, CACertFile), filepath.Join(elsewhere, CACertFile))
	other := newCA(t)
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"no hosts", CreateNode(t.TempDir(), "", "n1", nil, Options{}), ErrInvalid},
		{"bad host", CreateNode(dir, "", "n1", []string{"a b"}, Options{}), ErrInvalid},
		{"bad node id", CreateNode(dir, "", "-n1", []string{"h"}, Options{}), ErrInvalid},
		{"bad client name", CreateClient(dir, "", "a/b", Options{}), ErrInvalid},
		{"no CA", CreateNode(t.TempDir(), "", "n1", []string{"h"}, Options{}), ErrNoCA},
		{"CA key kept elsewhere, not given", CreateNode(elsewhere, "", "n1", []string{"h"}, Options{}), ErrNoCA},
		{"key of another CA", CreateClient(elsewhere, filepath.Join(other, CAKeyFile), "x", Options{}), ErrNoCA},
		{"negative lifetime", CreateClient(dir, "", "y", Options{Lifetime: -time.Hour}), ErrInvalid},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	// --ca-key FILE: the CA key kept elsewhere signs.
	if err := CreateNode(elsewhere, filepath.Join(dir, CAKeyFile), "n1", []string{"h"}, Options{}); err != nil {
		t.Fatalf("CreateNode with the CA key elsewhere: %v", err)
	}
	// A leaf never outlives its CA.
	if err := CreateClient(dir, "", "long", Options{Lifetime: 2 * DefaultCALifetime}); err != nil {
		t.Fatal(err)
	}
	if ca, c := readLeaf(t, filepath.Join(dir, CACertFile)), readLeaf(t, filepath.Join(dir, ClientCertFile("long"))); c.NotAfter.After(ca.NotAfter) {
		t.Fatalf("client NotAfter %v after CA's %v", c.NotAfter, ca.NotAfter)
	}
}

// handshake runs a TLS handshake over a pipe and returns each side's error
// and the certificate the server presented.
func handshake(t *testing.T, server, client *tls.Config) (serverErr, clientErr error, served *x509.Certificate) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, server)
		err := s.Handshake()
		if err == nil {
			// TLS 1.3 finishes the client side before the server has
			// checked the client's certificate; a read surfaces its verdict.
			_, _ = s.Write([]byte{1})
		}
		done <- err
		a.Close()
	}()
	c := tls.Client(b, client)
	clientErr = c.Handshake()
	if clientErr == nil {
		served = c.ConnectionState().PeerCertificates[0]
		var one [1]byte
		if _, err := c.Read(one[:]); err != nil {
			clientErr = err
		}
	}
	b.Close()
	return <-done, clientErr, served
}

func loadClientCert(t *testing.T, dir, name string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, ClientCertFile(name)), filepath.Join(dir, ClientKeyFile(name)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTLSConfigs(t *testing.T) {
	caDir := newCA(t)
	if err := CreateClient(caDir, "", "alice", Options{}); err != nil {
		t.Fatal(err)
	}
	foreign := newCA(t)
	if err := CreateClient(foreign, "", "alice", Options{}); err != nil {
		t.Fatal(err)
	}
	n1, err := NewReloader(ReloaderConfig{Dir: nodeDir(t, caDir, "n1"), NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	n2, err := NewReloader(ReloaderConfig{Dir: nodeDir(t, caDir, "n2")})
	if err != nil {
		t.Fatal(err)
	}
	evil, err := NewReloader(ReloaderConfig{Dir: nodeDir(t, foreign, "n1")})
	if err != nil {
		t.Fatal(err)
	}
	clientCfg := func(dir, name string) *tls.Config {
		c, err := ClientTLS(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		c.ServerName = "127.0.0.1"
		return c
	}
	// GetClientCertificate makes the client present the certificate even
	// when its issuer is not among the CAs the server asks for.
	presenting := func(c tls.Certificate) *tls.Config {
		return &tls.Config{InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }}
	}
	aliceRaw := presenting(loadClientCert(t, caDir, "alice"))
	foreignAlice := presenting(loadClientCert(t, foreign, "alice"))

	for _, tc := range []struct {
		name           string
		server, client *tls.Config
		wantOK         bool
	}{
		{"node to node", n1.NodeServerTLS(), n2.NodeClientTLS("127.0.0.1"), true},
		{"node to node by DNS name", n1.NodeServerTLS(), n2.NodeClientTLS("localhost"), true},
		{"node to node, wrong host", n1.NodeServerTLS(), n2.NodeClientTLS("elsewhere.example"), false},
		{"node to node, no server name", n1.NodeServerTLS(), n2.NodeClientTLS(""), false},
		{"client cert on node port", n1.NodeServerTLS(), aliceRaw, false},
		{"no cert on node port", n1.NodeServerTLS(), &tls.Config{InsecureSkipVerify: true}, false},
		{"foreign-CA node on node port", n1.NodeServerTLS(), evil.NodeClientTLS("127.0.0.1"), false},
		{"node dialing a foreign-CA server", evil.NodeServerTLS(), n2.NodeClientTLS("127.0.0.1"), false},
		{"public, no client cert", n1.PublicServerTLS(), clientCfg(caDir, ""), true},
		{"public, client cert", n1.PublicServerTLS(), clientCfg(caDir, "alice"), true},
		{"public, foreign client cert", n1.PublicServerTLS(), foreignAlice, false},
		{"client refuses a foreign server", evil.PublicServerTLS(), clientCfg(caDir, "alice"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serr, cerr, _ := handshake(t, tc.server, tc.client)
			if ok := serr == nil && cerr == nil; ok != tc.wantOK {
				t.Fatalf("server err %v, client err %v; want ok=%v", serr, cerr, tc.wantOK)
			}
		})
	}
	if _, err := NewReloader(ReloaderConfig{Dir: nodeDir(t, caDir, "n3"), NodeID: "n4"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("reloader for the wrong node id: %v, want ErrInvalid", err)
	}
}

// TestReloadServesRenewedCertificate renews node.crt the documented way
// (move the old files away, create-node again) and checks that the next
// handshake serves the new certificate: after Reload, and by itself once
// CheckInterval has passed.
func TestReloadServesRenewedCertificate(t *testing.T) {
	caDir := newCA(t)
	dir := nodeDir(t, caDir, "n1")
	now := time.Now()
	clock := func() time.Time { return now }
	r, err := NewReloader(ReloaderConfig{Dir: dir, CheckInterval: time.Minute, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := NewReloader(ReloaderConfig{Dir: nodeDir(t, caDir, "n2"), CheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	client := peer.NodeClientTLS("127.0.0.1")
	served := func() string {
		t.Helper()
		serr, cerr, c := handshake(t, r.NodeServerTLS(), client)
		if serr != nil || cerr != nil {
			t.Fatalf("handshake: server %v, client %v", serr, cerr)
		}
		return c.SerialNumber.Text(16)
	}
	renew := func() string {
		t.Helper()
		os.Remove(filepath.Join(dir, NodeCertFile))
		os.Remove(filepath.Join(dir, NodeKeyFile))
		if err := CreateNode(dir, filepath.Join(caDir, CAKeyFile), "n1", []string{"127.0.0.1"}, Options{}); err != nil {
			t.Fatal(err)
		}
		return readLeaf(t, filepath.Join(dir, NodeCertFile)).SerialNumber.Text(16)
	}
	first := served()

	second := renew()
	if got := served(); got != first {
		t.Fatalf("served %s before the check interval passed, want the old %s", got, first)
	}
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := served(); got != second {
		t.Fatalf("after Reload served %s, want the renewed %s", got, second)
	}

	third := renew()
	now = now.Add(2 * time.Minute)
	if got := served(); got != third {
		t.Fatalf("after the check interval served %s, want the renewed %s", got, third)
	}

	// A broken renewal (key of another certificate) keeps the old material.
	other := nodeDir(t, caDir, "n1")
	copyFile(t, filepath.Join(other, NodeKeyFile), filepath.Join(dir, NodeKeyFile))
	if err := r.Reload(); err == nil {
		t.Fatal("Reload with a mismatched key succeeded")
	}
	if s := r.Stats(); s.Failures != 1 || s.LastError == "" || s.Serial != third {
		t.Fatalf("stats after a failed reload: %+v, want 1 failure and serial %s", s, third)
	}
	if got := served(); got != third {
		t.Fatalf("after a failed reload served %s, want %s", got, third)
	}
	// A renewal for another node id is not picked up by a pinned Reloader.
	pinned, err := NewReloader(ReloaderConfig{Dir: other, NodeID: "n1", CheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(other, NodeCertFile))
	os.Remove(filepath.Join(other, NodeKeyFile))
	if err := CreateNode(other, filepath.Join(caDir, CAKeyFile), "n9", []string{"127.0.0.1"}, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := pinned.Reload(); err == nil || !strings.Contains(err.Error(), `"n9"`) {
		t.Fatalf("Reload of another node's certificate: %v", err)
	}
}

// TestCARotation walks SECURITY.md's procedure: (1) every node trusts a
// bundle of the old and the new CA, (2) nodes are re-issued by the new CA
// one by one while old- and new-signed nodes keep talking both ways, (3) the
// old CA is dropped and old-signed peers are shut out.
func TestCARotation(t *testing.T) {
	oldCA, newCA := newCA(t), newCA(t)
	bundle := func(dir string, cas ...string) {
		var b []byte
		for _, ca := range cas {
			p, err := os.ReadFile(filepath.Join(ca, CACertFile))
			if err != nil {
				t.Fatal(err)
			}
			b = append(b, p...)
		}
		if err := os.WriteFile(filepath.Join(dir, CACertFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	oldNode := nodeDir(t, oldCA, "n1")
	r1, err := NewReloader(ReloaderConfig{Dir: oldNode, CheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	// (1) The bundle, picked up by a reload.
	bundle(oldNode, oldCA, newCA)
	if err := r1.Reload(); err != nil {
		t.Fatal(err)
	}
	// (2) A node re-issued by the new CA (its dir has the bundle).
	newNode := t.TempDir()
	bundle(newNode, oldCA, newCA)
	if err := CreateNode(newNode, filepath.Join(newCA, CAKeyFile), "n2", []string{"127.0.0.1"}, Options{}); err != nil {
		t.Fatalf("signing with the new CA of a bundle: %v", err)
	}
	r2, err := NewReloader(ReloaderConfig{Dir: newNode, CheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if serr, cerr, _ := handshake(t, r2.NodeServerTLS(), r1.NodeClientTLS("127.0.0.1")); serr != nil || cerr != nil {
		t.Fatalf("old-signed node to new-signed node: %v / %v", serr, cerr)
	}
	if serr, cerr, _ := handshake(t, r1.NodeServerTLS(), r2.NodeClientTLS("127.0.0.1")); serr != nil || cerr != nil {
		t.Fatalf("new-signed node to old-signed node: %v / %v", serr, cerr)
	}
	// (3) The old CA dropped: a node still on an old-signed certificate fails.
	bundle(newNode, newCA)
	if err := r2.Reload(); err != nil {
		t.Fatal(err)
	}
	if serr, cerr, _ := handshake(t, r2.NodeServerTLS(), r1.NodeClientTLS("127.0.0.1")); serr == nil && cerr == nil {
		t.Fatal("an old-signed node still passes after the old CA was dropped")
	}
}

// TestRouterCertificate: a router certificate names a router, serves the
// router's public listeners, is a client of the nodes' public port, and
// never passes the Raft port's node-only handshake. A router's reloader
// prefers router.crt and falls back to node.crt (Kind says which).
func TestRouterCertificate(t *testing.T) {
	caDir := newCA(t)
	dir := t.TempDir()
	copyFile(t, filepath.Join(caDir, CACertFile), filepath.Join(dir, CACertFile))
	if err := CreateRouter(dir, filepath.Join(caDir, CAKeyFile), "edge-1", []string{"127.0.0.1"}, Options{}); err != nil {
		t.Fatal(err)
	}
	if err := CreateRouter(dir, filepath.Join(caDir, CAKeyFile), "edge-1", []string{"127.0.0.1"}, Options{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second create-router: %v, want ErrExists", err)
	}
	if err := CreateRouter(dir, filepath.Join(caDir, CAKeyFile), "edge-2", nil, Options{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("create-router without hosts: %v, want ErrInvalid", err)
	}
	leaf := readLeaf(t, filepath.Join(dir, RouterCertFile))
	if id, err := Identify(leaf); err != nil || id != (Identity{Kind: KindRouter, Name: "edge-1"}) {
		t.Fatalf("Identify(router.crt) = %v, %v", id, err)
	}
	if leaf.Subject.OrganizationalUnit[0] != OURouter {
		t.Fatalf("OU %v, want %s", leaf.Subject.OrganizationalUnit, OURouter)
	}
	if _, err := IdentifyNode(leaf); !errors.Is(err, ErrNotNode) {
		t.Fatalf("IdentifyNode(router.crt): %v, want ErrNotNode", err)
	}
	if _, err := IdentifyServer(leaf); err != nil {
		t.Fatalf("IdentifyServer(router.crt): %v", err)
	}

	rt, err := NewReloader(ReloaderConfig{Dir: dir, Router: true})
	if err != nil {
		t.Fatal(err)
	}
	if rt.Kind() != KindRouter || rt.NodeID() != "edge-1" {
		t.Fatalf("router reloader: kind %v id %q", rt.Kind(), rt.NodeID())
	}
	if _, err := NewReloader(ReloaderConfig{Dir: dir}); err == nil {
		t.Fatal("a node's reloader loaded a dir holding only router.crt")
	}
	legacy, err := NewReloader(ReloaderConfig{Dir: nodeDir(t, caDir, "old-router"), Router: true})
	if err != nil {
		t.Fatal(err)
	}
	if legacy.Kind() != KindNode {
		t.Fatalf("router with node.crt: kind %v, want node", legacy.Kind())
	}
	n1, err := NewReloader(ReloaderConfig{Dir: nodeDir(t, caDir, "n1"), NodeID: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ClientTLS(caDir, "")
	if err != nil {
		t.Fatal(err)
	}
	client.ServerName = "127.0.0.1"
	for _, tc := range []struct {
		name           string
		server, client *tls.Config
		wantOK         bool
	}{
		{"router on the Raft port", n1.NodeServerTLS(), rt.NodeClientTLS("127.0.0.1"), false},
		{"router on a node's public port", n1.PublicServerTLS(), rt.NodeClientTLS("127.0.0.1"), true},
		{"client of a router", rt.PublicServerTLS(), client, true},
		{"node on the Raft port", n1.NodeServerTLS(), legacy.NodeClientTLS("127.0.0.1"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serr, cerr, _ := handshake(t, tc.server, tc.client)
			if ok := serr == nil && cerr == nil; ok != tc.wantOK {
				t.Fatalf("server err %v, client err %v; want ok=%v", serr, cerr, tc.wantOK)
			}
		})
	}
}
