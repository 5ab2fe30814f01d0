// Package transport wires the trust boundary (security/pki, security/auth) into
// the listeners and dialers of idemnode and idemrouter: one Kit per process,
// built by the main from --certs-dir and --auth-file, handed to the process
// in its Config, used wherever the process listens or dials.
//
//	kit, err := transport.New(transport.Config{CertsDir: dir, AuthFile: file, NodeID: id, Logger: log, Registry: reg})
//	raft:      raftstore.Config.TLS = kit.RaftTLS()            (nil: plaintext)
//	dialing:   append(forward.DefaultDialOptions(), kit.DialOptions()...)
//	JSON API:  ln, _ := kit.ListenAPI(addr); handler = kit.HTTPHandler(api); timeouts kit.HTTPTimeouts()
//	proxy:     ln, _ := kit.ListenHTTP(addr)
//	gRPC:      ln, _ := kit.ListenGRPC(addr); api.NewGRPCServer(kit.GRPCServerOptions()...)
//	SIGHUP:    kit.ReloadOnSIGHUP(ctx)
//
// Without a certs dir the Kit is insecure: plaintext listeners and dials, and
// (without an auth file) every caller is root, as the contract says. With a
// certs dir: the Raft port takes only node certificates of the CA (raftstore
// does the handshake inside its mux); dials to nodes present node.crt and
// accept only a node certificate of the CA valid for the dialed host; the
// public listeners (JSON, gRPC, proxy) serve TLS only, a client certificate
// optional but verified against the CA when presented. Whatever the mode,
// every API call passes the Authorizer (probes excepted), and a request
// forwarded to another node carries its principal (auth's
// Idem-Forwarded-Principal), honoured there only from a node certificate.
//
// The edge limits apply in every mode: a cap on concurrent connections per
// listener (Limits.MaxConns), a connection to the JSON API or gRPC listener
// closed once idle for Limits.UnauthenticatedIdle (10 s) without having
// authenticated a request (conngate.go), and on gRPC a cap on concurrent
// streams per connection, a 10 s handshake deadline and a keepalive
// enforcement policy.
//
// # Choices (where the contract leaves room)
//
//   - One gRPC port serves clients and forwarding nodes alike: it uses the
//     public TLS config (client certificate optional, verified when
//     presented) and the Authorizer decides; a forwarded principal is
//     honoured only from a verified node certificate (security/auth).
//   - The secure-by-default rule (CheckExposure) applies with --dev too when
//     a listen flag names a non-loopback host; --dev on loopback needs none.
//   - Requests a router's proxy sends to the nodes carry no principal: the
//     node sees node:<router-id> (the router chose the namespace).
//   - SIGHUP reloads both the certificate files and the auth file;
//     certificates are also picked up by themselves within 10 s.
package transport
