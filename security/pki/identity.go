package pki

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Kind is what an idem certificate stands for.
type Kind int

// The kinds of idem leaf certificates.
const (
	// KindNode: a node (idemnode); server and client usage. Routers of
	// v1.1 hold node certificates too.
	KindNode Kind = iota + 1
	// KindClient: a user or program; client usage only; its name is the
	// principal of the auth file.
	KindClient
	// KindRouter: a router (idemrouter); server and client usage. Nodes
	// take it as a forwarding peer on their gRPC port, never on the Raft
	// port.
	KindRouter
)

// Peer reports whether k is one of idem's own processes (a node or a
// router): the peers whose forwarding metadata a node honours.
func (k Kind) Peer() bool { return k == KindNode || k == KindRouter }

func (k Kind) String() string {
	switch k {
	case KindNode:
		return "node"
	case KindClient:
		return "client"
	case KindRouter:
		return "router"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Identity is who a verified idem certificate names.
type Identity struct {
	Kind Kind
	// Name is the node id (KindNode), the principal name (KindClient) or
	// the router's name (KindRouter).
	Name string
}

func (id Identity) String() string { return id.Kind.String() + ":" + id.Name }

// The marker scheme (see doc.go): every idem leaf certificate carries exactly
// one URI SAN idem://node/<id>, idem://router/<name> or
// idem://client/<name>, and a matching
// OrganizationalUnit. Only the URI decides; the OU and the CN are for people
// reading the certificate with openssl.
const (
	uriScheme  = "idem"
	hostNode   = "node"
	hostClient = "client"
	hostRouter = "router"
	// OUNode and OUClient are the OrganizationalUnit of node and client
	// certificates.
	OUNode   = "idem-node"
	OUClient = "idem-client"
	// OURouter is the OrganizationalUnit of router certificates.
	OURouter = "idem-router"
	// Organization is the O of every certificate pki issues.
	Organization = "idem"
)

func identityURI(kind Kind, name string) *url.URL {
	host := hostNode
	switch kind {
	case KindClient:
		host = hostClient
	case KindRouter:
		host = hostRouter
	}
	return &url.URL{Scheme: uriScheme, Host: host, Path: "/" + name}
}

// namePattern is the grammar of node ids and principal names: it keeps them
// safe in file names (client.NAME.crt), URIs and log lines.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$`)

// ValidName reports whether name may be a node id or a principal name: 1-128
// bytes of [A-Za-z0-9._@-], starting with a letter or digit.
func ValidName(name string) bool { return namePattern.MatchString(name) }

// Identify returns the idem identity of cert, which the caller has already
// verified against the CA. A certificate with no idem URI SAN, with more than
// one, or whose key usage contradicts its kind (a "node" that cannot serve, a
// "client" that can) is ErrNotIdem.
func Identify(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != uriScheme {
			continue
		}
		name := strings.TrimPrefix(u.Path, "/")
		var kind Kind
		switch u.Host {
		case hostNode:
			kind = KindNode
		case hostClient:
			kind = KindClient
		case hostRouter:
			kind = KindRouter
		default:
			return Identity{}, fmt.Errorf("%w: unknown identity URI %q", ErrNotIdem, u)
		}
		if !ValidName(name) || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return Identity{}, fmt.Errorf("%w: malformed identity URI %q", ErrNotIdem, u)
		}
		found = append(found, Identity{Kind: kind, Name: name})
	}
	if len(found) != 1 {
		return Identity{}, fmt.Errorf("%w: %d idem identity URIs (want exactly 1) in certificate %q", ErrNotIdem, len(found), cert.Subject)
	}
	id := found[0]
	server := slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	client := slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	switch {
	case cert.IsCA:
		return Identity{}, fmt.Errorf("%w: a CA certificate is no leaf identity", ErrNotIdem)
	case (id.Kind == KindNode || id.Kind == KindRouter) && !(server && client):
		return Identity{}, fmt.Errorf("%w: %s certificate %q lacks server or client usage", ErrNotIdem, id.Kind, id.Name)
	case id.Kind == KindClient && (server || !client):
		return Identity{}, fmt.Errorf("%w: client certificate %q must have client usage only", ErrNotIdem, id.Name)
	}
	return id, nil
}

// IdentifyNode is Identify that also requires a node certificate: a router
// or client certificate is ErrNotNode (the Raft port's rule).
func IdentifyNode(cert *x509.Certificate) (Identity, error) {
	id, err := Identify(cert)
	if err != nil {
		return Identity{}, err
	}
	if id.Kind != KindNode {
		return Identity{}, fmt.Errorf("%w: %s", ErrNotNode, id)
	}
	return id, nil
}

// IdentifyServer is Identify that also requires a certificate a server may
// present to clients: a node's or a router's.
func IdentifyServer(cert *x509.Certificate) (Identity, error) {
	id, err := Identify(cert)
	if err != nil {
		return Identity{}, err
	}
	if !id.Kind.Peer() {
		return Identity{}, fmt.Errorf("%w: %s presented as a server certificate", ErrNotNode, id)
	}
	return id, nil
}
