// Package pki makes and loads the certificates of a secure idem cluster and
// builds the TLS configurations every link uses.
//
// # Issuing (idemctl cert)
//
// CreateCA writes ca.crt and ca.key (ECDSA P-256, self-signed, path length
// 0: it signs leaves only) and refuses to replace an existing CA.
// CreateNode writes node.crt/node.key for a node id and the hosts (DNS names
// or IPs) it is reached at; CreateClient writes client.NAME.crt/.key for a
// principal NAME. Keys are PKCS#8 PEM, mode 0600; certificates 0644. No
// function ever overwrites a file: files are written to a temporary name and
// hard-linked into place, which fails when the name exists (ErrExists).
//
// # Marker scheme: a client certificate never passes as a node
//
// Every leaf carries exactly one URI SAN, and only that URI decides who the
// certificate is:
//
//	idem://node/<node-id>      node (and router) certificates; ExtKeyUsage serverAuth + clientAuth
//	idem://client/<name>       client certificates; ExtKeyUsage clientAuth only
//
// The OU (idem-node / idem-client) and the CN (the id or name) repeat it for
// people reading the certificate with openssl. Identify rejects a
// certificate with zero or several idem URIs and one whose key usage
// contradicts its kind (a "node" without server usage, a "client" with it),
// so a client certificate cannot be made to look like a node by any field
// pki puts into it. Names follow ValidName: [A-Za-z0-9][A-Za-z0-9._@-]{0,127}.
//
// # TLS configurations and hot reload
//
// A Reloader holds the node's certificate and the CA pool of a certs dir and
// hands out configs whose every handshake uses the current material:
//
//	NodeServerTLS   Raft port, node-to-node forwarding: a node certificate of the CA is required
//	NodeClientTLS   dialing another node: present node.crt; the server must be a node of the CA, valid for the host
//	PublicServerTLS JSON, gRPC and proxy listeners: serve node.crt; a client certificate is optional but verified
//	ClientTLS       idemctl and the Go client: trust ca.crt, present client.NAME.crt, the server must be a node
//
// Renewed files are picked up without a restart: Reload (call it on SIGHUP),
// or automatically by the first handshake after CheckInterval (default 10
// s) once a file's size or modification time changed. A reload that fails
// (half-written renewal, key that does not match, certificate of another
// node) keeps the previous material and reports why (Stats().LastError and a
// log line). Because peers are re-verified in VerifyConnection against the
// pool current at that moment, dropping a CA from ca.crt also ends the
// resumption of sessions it had signed.
//
// ca.crt may hold several CA certificates: that is how the CA is rotated
// without downtime (SECURITY.md, "CA rotation").
//
// pki imports only the standard library.
package pki
