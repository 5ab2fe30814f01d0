// Package auth decides who may do what: it parses the --auth-file
// (principals with namespaces, roles and rates), maps a request's
// credentials to a principal and allows it or refuses it with the
// contract's code (docs/api.md, "Principals, namespaces and roles").
//
// # Decisions
//
//	no auth file (Config.File "")                   every caller is root (admin on "*")
//	no credentials, unknown token or certificate    401 UNAUTHENTICATED (gRPC UNAUTHENTICATED)
//	cert and token naming different principals      401
//	namespace outside the principal's patterns      403 PERMISSION_DENIED
//	verb above the principal's role                 403
//	over rate_per_s (burst: one second's worth)     429 RESOURCE_EXHAUSTED, Retry-After (gRPC RetryInfo)
//
// Verbs and the least role that may use them: get, list: reader;
// reserve, heartbeat, complete, release: writer; force-release, delete:
// admin on the namespace. The Admin service's cluster-wide RPCs (status,
// transfer-leader, snapshot) act on no namespace and need admin on "*". A
// request the classifier does not know (VerbUnknown) fails closed: admin on
// "*". Namespace patterns are exact names, prefixes ending in '*'
// ("billing-*" matches "billing-eu", not "billing"), or "*".
//
// Tokens are stored as their SHA-256 (token_sha256); a presented token is
// hashed and compared with every principal's hash in constant time. A
// client certificate's principal is the NAME in its idem://client/NAME URI
// (package pki), read only from a verified chain.
//
// # Forwarding
//
// A node or router that forwards a request (over mTLS with its node or
// router certificate) sends the principal it authenticated in
// Idem-Forwarded-Principal (gRPC metadata idem-forwarded-principal):
// ForwardHTTP and ForwardUnaryClientInterceptor do it. The receiver honours
// it only when the peer's verified certificate is a node or router
// certificate, and
// then checks that principal against its own auth file (so every process
// should have the same file); from any other peer the header is ignored and
// stripped. A node or router peer that forwards no principal is the internal
// principal node:<id> or router:<name>, admin on "*" (the process's own
// calls; a router may claim any principal anyway).
// A forwarded request is not charged to the rate limit again (the process
// the caller sent it to charged it). SECURITY.md gives the reasoning.
//
// # Wiring
//
//	a, err := auth.New(auth.Config{File: *authFile, Logger: log, Registry: reg})
//	http.Handler:  a.Middleware(apiHandler, auth.JSONAPITarget, nil)
//	gRPC server:   grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor(nil)), grpc.ChainStreamInterceptor(a.StreamServerInterceptor(nil))
//	gRPC forward:  grpc.WithUnaryInterceptor(auth.ForwardUnaryClientInterceptor())
//	client token:  client.Config.Token (client.BearerToken)
//	SIGHUP:        if err := a.Reload(); err != nil { /* logged; the old principals stay */ }
//
// The handler finds the principal with PrincipalFrom (operator actions log
// it). Metrics: idem_auth_decisions_total{outcome},
// idem_auth_reloads_total{result}; Stats returns the same figures.
package auth
