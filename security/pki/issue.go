package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// File names inside a certs dir (docs/api.md, "Certificates").
const (
	CACertFile   = "ca.crt"
	CAKeyFile    = "ca.key"
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
	// RouterCertFile and RouterKeyFile are a router's identity
	// (CreateRouter).
	RouterCertFile = "router.crt"
	RouterKeyFile  = "router.key"
)

// ClientCertFile and ClientKeyFile name the files of principal name's client
// certificate: client.NAME.crt and client.NAME.key.
func ClientCertFile(name string) string { return "client." + name + ".crt" }

// ClientKeyFile: see ClientCertFile.
func ClientKeyFile(name string) string { return "client." + name + ".key" }

// Default lifetimes of what pki issues. A CA outlives many renewals of the
// leaves it signs; leaves are renewed (create-node again after moving the old
// files away, then the node picks them up without a restart).
const (
	DefaultCALifetime   = 10 * 365 * 24 * time.Hour
	DefaultLeafLifetime = 2 * 365 * 24 * time.Hour
	// backdate covers clock skew between the issuing machine and the nodes.
	backdate = time.Hour
)

// Options tune issuing. The zero value issues with the defaults.
type Options struct {
	// Lifetime is how long the certificate is valid from now. Zero means
	// DefaultCALifetime for a CA and DefaultLeafLifetime for a leaf. A leaf
	// never outlives its CA: its NotAfter is capped at the CA's.
	Lifetime time.Duration
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// CreateCA writes a new CA into dir (created 0700 if missing): ca.crt and
// ca.key (mode 0600), an ECDSA P-256 key and a self-signed certificate that
// can sign leaves only (path length 0). It refuses (ErrExists) when either
// file is already there: a second CA would silently split the cluster.
func CreateCA(dir string, opts Options) error {
	if opts.Lifetime < 0 {
		return fmt.Errorf("%w: lifetime %v is negative", ErrInvalid, opts.Lifetime)
	}
	for _, f := range []string{CACertFile, CAKeyFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%w: %s: refusing to replace a CA (every certificate it signed would stop working)", ErrExists, filepath.Join(dir, f))
		}
	}
	lifetime := opts.Lifetime
	if lifetime == 0 {
		lifetime = DefaultCALifetime
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: generating CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	now := opts.now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{Organization}, CommonName: "idem CA " + now.UTC().Format("2006-01-02") + " " + serial.Text(16)[:8]},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("pki: signing CA certificate: %w", err)
	}
	return writePair(dir, CACertFile, CAKeyFile, der, key)
}

// CreateNode writes node.crt and node.key (mode 0600) into dir: a
// certificate for node id nodeID, valid for every host (a DNS name or an IP
// address), usable as server and client, signed by the CA in dir/ca.crt with
// the key caKeyPath (empty: dir/ca.key). It refuses (ErrExists) to overwrite
// an existing node.crt or node.key.
func CreateNode(dir, caKeyPath, nodeID string, hosts []string, opts Options) error {
	return createServer(dir, caKeyPath, KindNode, nodeID, hosts, opts)
}

// CreateRouter writes router.crt and router.key (mode 0600) into dir: a
// router identity named name, valid for every host, usable as server (the
// router's listeners) and client (its calls to the nodes), signed like
// CreateNode's. Nodes accept it on their gRPC port as a forwarding peer and
// never on the Raft port. It refuses (ErrExists) to overwrite.
func CreateRouter(dir, caKeyPath, name string, hosts []string, opts Options) error {
	return createServer(dir, caKeyPath, KindRouter, name, hosts, opts)
}

func createServer(dir, caKeyPath string, kind Kind, name string, hosts []string, opts Options) error {
	if !ValidName(name) {
		return fmt.Errorf("%w: %s id %q must be 1-128 bytes of [A-Za-z0-9._@-], starting with a letter or digit", ErrInvalid, kind, name)
	}
	if len(hosts) == 0 {
		return fmt.Errorf("%w: a %s certificate needs at least one HOST (DNS name or IP address) it is reached at", ErrInvalid, kind)
	}
	var dns []string
	var ips []net.IP
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if !dnsPattern.MatchString(h) {
			return fmt.Errorf("%w: host %q is neither an IP address nor a DNS name", ErrInvalid, h)
		}
		dns = append(dns, h)
	}
	ou, certFile, keyFile := OUNode, NodeCertFile, NodeKeyFile
	if kind == KindRouter {
		ou, certFile, keyFile = OURouter, RouterCertFile, RouterKeyFile
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{Organization}, OrganizationalUnit: []string{ou}, CommonName: name},
		DNSNames:    dns,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	return issueLeaf(dir, caKeyPath, kind, name, tmpl, certFile, keyFile, opts)
}

// CreateClient writes client.NAME.crt and client.NAME.key (mode 0600) into
// dir: a client-only certificate whose identity is the principal name,
// signed like CreateNode's. It refuses (ErrExists) to overwrite.
func CreateClient(dir, caKeyPath, name string, opts Options) error {
	if !ValidName(name) {
		return fmt.Errorf("%w: principal name %q must be 1-128 bytes of [A-Za-z0-9._@-], starting with a letter or digit", ErrInvalid, name)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{Organization}, OrganizationalUnit: []string{OUClient}, CommonName: name},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return issueLeaf(dir, caKeyPath, KindClient, name, tmpl, ClientCertFile(name), ClientKeyFile(name), opts)
}

var dnsPattern = regexp.MustCompile(`^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)

func issueLeaf(dir, caKeyPath string, kind Kind, name string, tmpl *x509.Certificate, certFile, keyFile string, opts Options) error {
	if opts.Lifetime < 0 {
		return fmt.Errorf("%w: lifetime %v is negative", ErrInvalid, opts.Lifetime)
	}
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("%w: %s (move it away to issue a new one)", ErrExists, filepath.Join(dir, f))
		}
	}
	if caKeyPath == "" {
		caKeyPath = filepath.Join(dir, CAKeyFile)
	}
	caCert, caKey, err := LoadCA(filepath.Join(dir, CACertFile), caKeyPath)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: generating key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	lifetime := opts.Lifetime
	if lifetime == 0 {
		lifetime = DefaultLeafLifetime
	}
	now := opts.now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = now.Add(lifetime)
	if tmpl.NotAfter.After(caCert.NotAfter) {
		tmpl.NotAfter = caCert.NotAfter
	}
	if !tmpl.NotAfter.After(now) {
		return fmt.Errorf("%w: the CA in %s expired at %s", ErrNoCA, dir, caCert.NotAfter.UTC().Format(time.RFC3339))
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	tmpl.URIs = append(tmpl.URIs, identityURI(kind, name))
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("pki: signing %s certificate: %w", kind, err)
	}
	return writePair(dir, certFile, keyFile, der, key)
}

// LoadCA reads the CA certificate bundle certPath and the CA key keyPath and
// returns the certificate of the bundle that matches the key (a bundle holds
// two CAs during a rotation).
func LoadCA(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	certs, err := readCerts(certPath)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrNoCA, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w (pass --ca-key FILE if the CA key is kept elsewhere)", ErrNoCA, err)
	}
	signer, err := parseKey(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %w", ErrNoCA, keyPath, err)
	}
	for _, c := range certs {
		if !c.IsCA {
			continue
		}
		if pub, ok := c.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); ok && pub.Equal(signer.Public()) {
			return c, signer, nil
		}
	}
	return nil, nil, fmt.Errorf("%w: the key %s belongs to no CA certificate in %s", ErrNoCA, keyPath, certPath)
}

// readCerts reads every CERTIFICATE block of a PEM file.
func readCerts(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no PEM CERTIFICATE block", path)
	}
	return out, nil
}

func parseKey(data []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, errors.New("no PEM block")
	}
	var k any
	var err error
	switch b.Type {
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(b.Bytes)
	default:
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	}
	if err != nil {
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key of type %T cannot sign", k)
	}
	return s, nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// writePair writes a certificate (0644) and its key (0600) under dir without
// ever replacing an existing file: each is written to a temporary file and
// hard-linked into place, which fails if the name exists.
func writePair(dir, certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("pki: encoding key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: creating certs dir: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	keyPath := filepath.Join(dir, keyFile)
	if err := writeNew(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeNew(filepath.Join(dir, certFile), certPEM, 0o644); err != nil {
		os.Remove(keyPath)
		return err
	}
	return nil
}

func writeNew(path string, data []byte, perm fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: writing %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("pki: writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("pki: writing %s: %w", path, err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, path)
		}
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}
