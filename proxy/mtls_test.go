package proxy_test

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/proxy"
)

// testCA issues client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idem test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	_, cert, key := testutil.Certificate(t, tmpl, nil, nil)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// client returns a TLS client certificate for cn and its leaf.
func (ca *testCA) client(t *testing.T, cn string, serial int64) (tls.Certificate, *x509.Certificate) {
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, leaf, key := testutil.Certificate(t, tmpl, ca.cert, ca.key)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf
}

func TestNamespacesFromClientCertificates(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(time.Second)
	cfg := proxy.DefaultConfig()
	cfg.Upstream, cfg.Store, cfg.Logger = up.srv.URL, proxy.BackendStore(be), testutil.Logger(t, slog.LevelDebug)
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t)
	srv := httptest.NewUnstartedServer(p)
	srv.TLS = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: ca.pool}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	clientWith := func(certs ...tls.Certificate) *http.Client {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.TLSClientConfig.Certificates = certs
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	aliceCert, _ := ca.client(t, "alice", 2)
	bobCert, bobLeaf := ca.client(t, "Bob Smith", 3) // not a namespace: named by its key
	alice, bob, anonymous := clientWith(aliceCert), clientWith(bobCert), clientWith()

	post := func(c *http.Client) reply {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/ok", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "same-key")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
	}
	a1, b1, n1 := post(alice), post(bob), post(anonymous)
	a2, b2, n2 := post(alice), post(bob), post(anonymous)
	bodies := map[string]bool{a1.Body: true, b1.Body: true, n1.Body: true}
	if len(bodies) != 3 || up.Runs("same-key") != 3 {
		t.Fatalf("three callers, one key: %d distinct answers, %d upstream runs: %q %q %q", len(bodies), up.Runs("same-key"), a1.Body, b1.Body, n1.Body)
	}
	for _, pair := range [][2]reply{{a1, a2}, {b1, b2}, {n1, n2}} {
		if pair[1].Body != pair[0].Body || pair[1].Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay %q of %q", pair[1].Body, pair[0].Body)
		}
	}
	sum := sha256.Sum256(bobLeaf.RawSubjectPublicKeyInfo)
	for _, ns := range []string{"alice", "spki-" + hex.EncodeToString(sum[:20]), "default"} {
		if _, ok := be.record(t, ns, "same-key"); !ok {
			t.Errorf("no record in namespace %s", ns)
		}
	}
}
