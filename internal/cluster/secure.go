package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/security/pki"
)

// Secure turns the cluster's processes into secure ones (call it after
// NewNodes, before NewRouter and before starting anything): it makes a CA
// under Dir/certs/ca, one certs dir per node (Dir/certs/<id>, node
// certificate for 127.0.0.1 and localhost) and one per router (a router
// certificate, or a node certificate with RouterNodeCerts), a client
// certificate for each of clients in the CA dir, and adds --certs-dir (and
// --auth-file when authFile is not empty) to every node; NewRouter does the
// same for routers. Probes and APIs of the cluster then speak TLS.
func (c *Cluster) Secure(authFile string, clients ...string) error {
	c.CADir = filepath.Join(c.Dir, "certs", "ca")
	c.AuthFile = authFile
	if err := pki.CreateCA(c.CADir, pki.Options{}); err != nil {
		return err
	}
	for _, name := range clients {
		if err := pki.CreateClient(c.CADir, filepath.Join(c.CADir, pki.CAKeyFile), name, pki.Options{}); err != nil {
			return err
		}
	}
	for id, p := range c.Nodes {
		dir, err := c.NodeCertsDir(id)
		if err != nil {
			return err
		}
		p.Args = append(p.Args, c.secureArgs(dir)...)
	}
	return nil
}

// SecureWithPolicy is Secure with an auth file of the given body, written
// to Dir/auth.yaml.
func (c *Cluster) SecureWithPolicy(policy string, clients ...string) error {
	authFile := filepath.Join(c.Dir, "auth.yaml")
	if err := os.WriteFile(authFile, []byte(policy), 0o600); err != nil {
		return err
	}
	return c.Secure(authFile, clients...)
}

// NodeCertsDir makes (once) and returns the certs dir of node (or v1.1
// router) id: a copy of ca.crt and a node certificate for 127.0.0.1 and
// localhost.
func (c *Cluster) NodeCertsDir(id string) (string, error) {
	return c.certsDir(id, pki.KindNode)
}

// RouterCertsDir is NodeCertsDir with a router certificate (router.crt).
func (c *Cluster) RouterCertsDir(name string) (string, error) {
	return c.certsDir(name, pki.KindRouter)
}

func (c *Cluster) certsDir(id string, kind pki.Kind) (string, error) {
	dir := filepath.Join(c.Dir, "certs", id)
	certFile, create := pki.NodeCertFile, pki.CreateNode
	if kind == pki.KindRouter {
		certFile, create = pki.RouterCertFile, pki.CreateRouter
	}
	if _, err := os.Stat(filepath.Join(dir, certFile)); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	ca, err := os.ReadFile(filepath.Join(c.CADir, pki.CACertFile))
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, pki.CACertFile), ca, 0o644); err != nil {
		return "", err
	}
	if err := create(dir, filepath.Join(c.CADir, pki.CAKeyFile), id, []string{"127.0.0.1", "localhost"}, pki.Options{}); err != nil {
		return "", fmt.Errorf("cluster: certificate of %s: %w", id, err)
	}
	return dir, nil
}

func (c *Cluster) secureArgs(certsDir string) []string {
	args := []string{"--certs-dir", certsDir}
	if c.AuthFile != "" {
		args = append(args, "--auth-file", c.AuthFile)
	}
	return args
}

// ClientTLS is the TLS config of a client of the secure cluster presenting
// the client certificate of name ("" presents none); nil for an insecure
// cluster.
func (c *Cluster) ClientTLS(name string) (*tls.Config, error) {
	if c.CADir == "" {
		return nil, nil
	}
	return pki.ClientTLS(c.CADir, name)
}

// HTTPClient is an HTTP client for the cluster's JSON APIs presenting the
// client certificate of name ("" none); tlsCfg nil means plaintext.
func httpClient(tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64, TLSClientConfig: tlsCfg}}
}

// API returns a JSON API client for addr (HOST:PORT, a node's or a
// router's): https with the client certificate of user ("" none) on a
// secure cluster, else plaintext as NewAPI.
func (c *Cluster) API(addr, user string) (*API, error) {
	cfg, err := c.ClientTLS(user)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		return NewAPI(addr), nil
	}
	return &API{Base: "https://" + addr, Client: httpClient(cfg)}, nil
}

// probe waits until addr's /readyz answers 200 (over TLS on a secure
// cluster; the probes need no credentials).
func (c *Cluster) probe(ctx context.Context, addr string) error {
	api, err := c.API(addr, "")
	if err != nil {
		return err
	}
	return launch.WaitHTTPClient(ctx, api.Client, api.Base+"/readyz")
}
