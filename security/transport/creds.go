package transport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"

	"github.com/idem-dev/idem/security/pki"
)

// nodeCreds are gRPC client credentials for dialing a node: one TLS config
// per handshake, made by pki for the host of the dialed authority, so the
// node certificate is checked against that host and the current CA.
type nodeCreds struct {
	certs *pki.Reloader
}

func (c *nodeCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	host, _, err := net.SplitHostPort(authority)
	if err != nil {
		host = authority
	}
	return credentials.NewTLS(c.certs.NodeClientTLS(host, "h2")).ClientHandshake(ctx, authority, raw)
}

func (c *nodeCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("transport: node credentials are for dialing only")
}

func (c *nodeCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (c *nodeCreds) Clone() credentials.TransportCredentials { return &nodeCreds{certs: c.certs} }

func (c *nodeCreds) OverrideServerName(string) error { return nil }

// Loopback reports whether the listen address addr (HOST:PORT) binds only
// loopback (127.0.0.0/8, ::1 or localhost; CheckLoopback's rule). An
// empty host or 0.0.0.0 binds every interface and is not loopback.
func Loopback(addr string) bool { return CheckLoopback("", addr) == nil }

// CheckLoopback reports an error unless addr is HOST:PORT with a loopback
// host (127.0.0.0/8, ::1 or localhost): the profiling endpoints expose
// memory contents and cost CPU, so they are never served to the network.
func CheckLoopback(flagName, addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q is not HOST:PORT: %v", flagName, addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s %q: only a loopback address (127.0.0.1, ::1, localhost) is allowed", flagName, addr)
	}
	return nil
}

// CheckExposure is the contract's secure-by-default rule: a process whose
// listen addresses are not all loopback refuses to start without a certs
// dir unless insecure is set. addrs maps a flag name to its address.
func CheckExposure(addrs map[string]string, certsDir string, insecure bool) error {
	if certsDir != "" || insecure {
		return nil
	}
	var exposed []string
	for _, name := range slices.Sorted(maps.Keys(addrs)) {
		if !Loopback(addrs[name]) {
			exposed = append(exposed, name+" "+addrs[name])
		}
	}
	if len(exposed) == 0 {
		return nil
	}
	return fmt.Errorf("refusing to listen beyond loopback without TLS (%s): pass --certs-dir DIR (make one with idemctl cert), or --insecure to accept plaintext, unauthenticated traffic", strings.Join(exposed, ", "))
}
