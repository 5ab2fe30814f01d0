package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultCheckInterval is how often, at most, a handshake makes a Reloader
// look at its files' modification times.
const DefaultCheckInterval = 10 * time.Second

// ReloaderConfig configures a Reloader.
type ReloaderConfig struct {
	// Dir is the certs dir holding ca.crt, node.crt and node.key. Required.
	Dir string
	// NodeID, when set, must be the node id of node.crt: a process started
	// with another node's certs dir then refuses to start (and a renewal for
	// the wrong node is not picked up). Empty accepts any node certificate.
	NodeID string
	// Router: the process is a router. It presents router.crt/router.key
	// when the certs dir holds them (CreateRouter), else node.crt/node.key
	// as in v1.1 (Kind then says KindNode, so the router can warn).
	Router bool
	// CheckInterval is how often, at most, a TLS handshake stats the three
	// files and reloads them if any changed. Zero means
	// DefaultCheckInterval; negative disables the check (Reload only, e.g.
	// on SIGHUP).
	CheckInterval time.Duration
	// Logger receives reload events; nil discards them.
	Logger *slog.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Reloader holds a node's certificate, key and CA pool, read from a certs
// dir, and hands out TLS configurations that always use the current ones. A
// renewed node.crt/node.key (or a ca.crt with a second CA during a rotation)
// is picked up without a restart: on Reload, or by the next handshake after
// CheckInterval once the files changed. A reload that fails (a half-written
// renewal, a key that does not match) keeps the previous material.
type Reloader struct {
	cfg    ReloaderConfig
	kind   Kind // of the certificate files in use: KindNode or KindRouter
	logger *slog.Logger
	cur    atomic.Pointer[material]

	mu        sync.Mutex // serialises Reload
	lastCheck atomic.Int64
	reloads   atomic.Uint64
	failures  atomic.Uint64
	lastErr   atomic.Pointer[string]
}

// material is one consistent load of the certs dir.
type material struct {
	cert   tls.Certificate // Leaf set
	pool   *x509.CertPool
	id     Identity
	stamps [3]fileStamp
}

type fileStamp struct {
	size    int64
	modTime time.Time
}

// NewReloader loads the certs dir; it fails if any file is missing, the key
// does not match, node.crt is not a node certificate signed by ca.crt, or it
// names another node than cfg.NodeID.
func NewReloader(cfg ReloaderConfig) (*Reloader, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: ReloaderConfig.Dir is required", ErrInvalid)
	}
	if cfg.NodeID != "" && !ValidName(cfg.NodeID) {
		return nil, fmt.Errorf("%w: node id %q", ErrInvalid, cfg.NodeID)
	}
	r := &Reloader{cfg: cfg, logger: cfg.Logger, kind: KindNode}
	if cfg.Router {
		if cfg.NodeID != "" {
			return nil, fmt.Errorf("%w: a router's ReloaderConfig has no NodeID", ErrInvalid)
		}
		if _, err := os.Stat(filepath.Join(cfg.Dir, RouterCertFile)); err == nil {
			r.kind = KindRouter
		}
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	m, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(m)
	r.lastCheck.Store(r.now().UnixNano())
	return r, nil
}

func (r *Reloader) now() time.Time {
	if r.cfg.Now != nil {
		return r.cfg.Now()
	}
	return time.Now()
}

func (r *Reloader) paths() [3]string {
	certFile, keyFile := NodeCertFile, NodeKeyFile
	if r.kind == KindRouter {
		certFile, keyFile = RouterCertFile, RouterKeyFile
	}
	return [3]string{
		filepath.Join(r.cfg.Dir, CACertFile),
		filepath.Join(r.cfg.Dir, certFile),
		filepath.Join(r.cfg.Dir, keyFile),
	}
}

func (r *Reloader) stamps() ([3]fileStamp, error) {
	var out [3]fileStamp
	for i, p := range r.paths() {
		fi, err := os.Stat(p)
		if err != nil {
			return out, err
		}
		out[i] = fileStamp{size: fi.Size(), modTime: fi.ModTime()}
	}
	return out, nil
}

func (r *Reloader) load() (*material, error) {
	p := r.paths()
	stamps, err := r.stamps()
	if err != nil {
		return nil, fmt.Errorf("pki: certs dir: %w", err)
	}
	cas, err := readCerts(p[0])
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		if !c.IsCA {
			return nil, fmt.Errorf("pki: %s holds a certificate that is not a CA (%q)", p[0], c.Subject)
		}
		pool.AddCert(c)
	}
	cert, err := tls.LoadX509KeyPair(p[1], p[2])
	if err != nil {
		return nil, fmt.Errorf("pki: %s certificate: %w", r.kind, err)
	}
	if _, err := verifyLeaf(pool, cert.Leaf, cert.Certificate, r.now(), x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, fmt.Errorf("pki: %s is not signed by %s or not valid now: %w", p[1], p[0], err)
	}
	id, err := Identify(cert.Leaf)
	if err == nil && id.Kind != r.kind {
		err = fmt.Errorf("%w: %s holds a %s certificate, want a %s certificate", ErrNotNode, p[1], id.Kind, r.kind)
	}
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", p[1], err)
	}
	if r.cfg.NodeID != "" && id.Name != r.cfg.NodeID {
		return nil, fmt.Errorf("%w: %s is node %q's certificate, this is node %q", ErrInvalid, p[1], id.Name, r.cfg.NodeID)
	}
	return &material{cert: cert, pool: pool, id: id, stamps: stamps}, nil
}

// Reload re-reads the certs dir now. On failure the previous certificate and
// pool stay in use and the error says why.
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastCheck.Store(r.now().UnixNano())
	m, err := r.load()
	if err != nil {
		r.failures.Add(1)
		msg := err.Error()
		r.lastErr.Store(&msg)
		r.logger.Warn("certificate reload failed; keeping the previous certificates", "dir", r.cfg.Dir, "error", msg)
		return err
	}
	old := r.cur.Swap(m)
	r.reloads.Add(1)
	r.lastErr.Store(nil)
	if old == nil || old.stamps != m.stamps {
		r.logger.Info("certificates loaded", "dir", r.cfg.Dir, "node", m.id.Name,
			"serial", m.cert.Leaf.SerialNumber.Text(16), "not_after", m.cert.Leaf.NotAfter.UTC())
	}
	return nil
}

// maybeReload reloads when CheckInterval has passed since the last look and
// a file changed. At most one handshake pays for the stat calls.
func (r *Reloader) maybeReload() {
	if r.cfg.CheckInterval < 0 {
		return
	}
	interval := r.cfg.CheckInterval
	if interval == 0 {
		interval = DefaultCheckInterval
	}
	last := r.lastCheck.Load()
	now := r.now().UnixNano()
	if now-last < int64(interval) || !r.lastCheck.CompareAndSwap(last, now) {
		return
	}
	stamps, err := r.stamps()
	if err == nil && stamps == r.cur.Load().stamps {
		return
	}
	_ = r.Reload() // logged; the old material stays
}

func (r *Reloader) current() *material {
	r.maybeReload()
	return r.cur.Load()
}

// ReloaderStats are a Reloader's figures for tests and status pages.
type ReloaderStats struct {
	NodeID    string
	Serial    string // hex serial number of the node certificate in use
	NotAfter  time.Time
	Reloads   uint64 // successful reloads after the first load
	Failures  uint64 // reloads that failed and kept the old material
	LastError string // "" after a successful reload
}

// Stats returns the current figures.
func (r *Reloader) Stats() ReloaderStats {
	m := r.cur.Load()
	s := ReloaderStats{
		NodeID:   m.id.Name,
		Serial:   m.cert.Leaf.SerialNumber.Text(16),
		NotAfter: m.cert.Leaf.NotAfter,
		Reloads:  r.reloads.Load(),
		Failures: r.failures.Load(),
	}
	if e := r.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// NodeID is the node id (or the router's name) of the certificate in use.
func (r *Reloader) NodeID() string { return r.cur.Load().id.Name }

// Kind is the kind of the certificate in use: KindNode, or KindRouter for a
// router whose certs dir holds router.crt.
func (r *Reloader) Kind() Kind { return r.kind }

// NodeServerTLS is the server side of node-to-node links (the Raft port):
// the peer must present a node certificate signed by the current CA; a
// router or client certificate, a foreign CA or none fail the handshake.
func (r *Reloader) NodeServerTLS(nextProtos ...string) *tls.Config {
	return r.serverTLS(true, nextProtos)
}

// PublicServerTLS is the server side of the public listeners (JSON API,
// gRPC, proxy): it serves the node certificate; a client certificate is
// optional, but one that is presented must chain to the current CA (else
// the handshake fails). Which principal it names is for auth to decide.
// nextProtos are the ALPN protocols; none means "h2" and "http/1.1".
func (r *Reloader) PublicServerTLS(nextProtos ...string) *tls.Config {
	if len(nextProtos) == 0 {
		nextProtos = []string{"h2", "http/1.1"}
	}
	return r.serverTLS(false, nextProtos)
}

func (r *Reloader) serverTLS(nodeOnly bool, nextProtos []string) *tls.Config {
	protos := append([]string(nil), nextProtos...)
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: protos,
		// Each handshake gets a config built from the material current at
		// that moment, so a reload needs no restart of the listener.
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := r.current()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   protos,
				Certificates: []tls.Certificate{m.cert},
				ClientCAs:    m.pool,
				ClientAuth:   tls.VerifyClientCertIfGiven,
			}
			if nodeOnly {
				c.ClientAuth = tls.RequireAndVerifyClientCert
			}
			// VerifyConnection runs on resumed sessions too, so a session
			// ticket issued before a CA was dropped does not outlive it.
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 {
					if nodeOnly {
						return errors.New("pki: a node certificate is required")
					}
					return nil
				}
				leaf, err := verifyLeaf(r.cur.Load().pool, cs.PeerCertificates[0], rawChain(cs.PeerCertificates), r.now(), x509.ExtKeyUsageClientAuth)
				if err != nil {
					return err
				}
				if nodeOnly {
					_, err = IdentifyNode(leaf)
				} else {
					_, err = Identify(leaf)
				}
				return err
			}
			return c, nil
		},
	}
}

// NodeClientTLS is the client side of node-to-node links (Raft dials,
// forwarding, router-to-node calls) to the host serverName (a DNS name or an
// IP, as dialed): it presents the current node certificate and accepts only
// a server presenting a node certificate that chains to the current CA and
// is valid for serverName. Make one per dialed host (one per gRPC target).
func (r *Reloader) NodeClientTLS(serverName string, nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		NextProtos: append([]string(nil), nextProtos...),
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := r.current().cert
			return &c, nil
		},
		// The standard verification would pin the pool at construction;
		// VerifyConnection does the same checks against the current pool.
		// (ConnectionState.ServerName is empty for an IP, so the host the
		// closure verifies is the one given here.)
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyNodeServer(r.current().pool, cs.PeerCertificates, serverName, r.now())
		},
	}
}

func verifyNodeServer(pool *x509.CertPool, peer []*x509.Certificate, serverName string, now time.Time) error {
	if len(peer) == 0 {
		return errors.New("pki: the server presented no certificate")
	}
	if serverName == "" {
		return errors.New("pki: no server name to verify the node certificate against")
	}
	leaf := peer[0]
	if _, err := verifyLeaf(pool, leaf, rawChain(peer), now, x509.ExtKeyUsageServerAuth); err != nil {
		return err
	}
	if err := leaf.VerifyHostname(serverName); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	_, err := IdentifyNode(leaf)
	return err
}

// ClientTLS is the configuration of a client (idemctl, the Go client) of a
// secure cluster: it trusts dir/ca.crt, presents client.NAME.crt when name
// is not empty (token users pass ""), and accepts only servers with a node
// certificate or a router certificate. It is read once; clients are
// short-lived or restarted to
// pick up a renewal.
func ClientTLS(dir, name string) (*tls.Config, error) {
	cas, err := readCerts(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCA, err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    pool,
		// The standard verification (chain, host name) has run; this adds
		// the rule that the server is a node or a router.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 {
				return errors.New("pki: the server's certificate was not verified")
			}
			_, err := IdentifyServer(cs.VerifiedChains[0][0])
			return err
		},
	}
	if name != "" {
		if !ValidName(name) {
			return nil, fmt.Errorf("%w: principal name %q", ErrInvalid, name)
		}
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, ClientCertFile(name)), filepath.Join(dir, ClientKeyFile(name)))
		if err != nil {
			return nil, fmt.Errorf("pki: client certificate of %q: %w (make one with idemctl cert create-client)", name, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

func rawChain(certs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(certs))
	for i, c := range certs {
		out[i] = c.Raw
	}
	return out
}

// verifyLeaf checks that leaf chains to pool (intermediates from the rest
// of chain) at now and allows every one of usages.
func verifyLeaf(pool *x509.CertPool, leaf *x509.Certificate, chain [][]byte, now time.Time, usages ...x509.ExtKeyUsage) (*x509.Certificate, error) {
	inter := x509.NewCertPool()
	for _, der := range chain[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("pki: peer chain: %w", err)
		}
		inter.AddCert(c)
	}
	for _, u := range usages {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return nil, fmt.Errorf("pki: %w", err)
		}
	}
	return leaf, nil
}
