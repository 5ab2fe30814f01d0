// Package proxy is idem's transparent idempotency proxy, the handler behind
// `idemrouter --upstream URL` (docs/api.md, "Proxy mode"): it forwards every
// request to the upstream and makes POST and PATCH requests that carry an
// Idempotency-Key idempotent, storing the upstream's answer in idem and
// replaying it to retries.
//
// The semantics live in httpidem, the engine that client.Middleware
// uses too, so the proxy and the middleware behave the same by construction;
// that package's doc lists them in full. This package adds the upstream
// forwarding (net/http/httputil.ReverseProxy), the 502 and 504 answers, the
// metrics, and BackendStore, which lets the proxy keep its keys in the
// router's own backend.Backend.
//
// # Wiring it into idemrouter
//
// In cmd/idemrouter's run(), once the router's backend.Backend (the
// forwarding backend that the JSON and gRPC APIs serve) and the process's
// Prometheus registry exist, and only when --upstream is set:
//
//	pcfg := proxy.DefaultConfig()
//	pcfg.Upstream = upstream               // --upstream
//	pcfg.RequireKey = requireKey           // --require-key
//	pcfg.NamespaceHeader = namespaceHeader // --namespace-header ("" when not given)
//	pcfg.MaxRequestBytes = maxRequestBytes // --max-request-bytes (default 1 MiB)
//	pcfg.Store = proxy.BackendStore(backend)
//	pcfg.StoreTimeout = requestTimeout     // --request-timeout (optional; default 10s)
//	pcfg.Logger = logger.With("component", "proxy")
//	pcfg.Registry = registry               // the registry /metrics serves on --http-addr
//	px, err := proxy.New(pcfg)
//	if err != nil {
//		return err // a bad --upstream or limit: one clear line, exit non-zero
//	}
//	proxyServer := &http.Server{
//		Addr:              proxyAddr, // --proxy-addr, default 127.0.0.1:8088
//		Handler:           px,
//		ReadHeaderTimeout: 10 * time.Second,
//	}
//	// Listen on proxyAddr up front (a taken port is a startup error), serve
//	// it next to the API server, and on SIGTERM call proxyServer.Shutdown
//	// with the drain deadline along with the others: Shutdown waits for the
//	// requests in flight, and each of those stores or releases its key
//	// before it returns.
//
// The proxy serves only proxied traffic: the router's API, /healthz, /readyz
// and /metrics stay on --http-addr. Set pcfg.MaxStoredBodyBytes when the
// nodes run with a --max-response-bytes other than the default 1 MiB (a
// larger body is stored without it either way; the setting only saves a
// refused round trip).
//
// # Identity (docs/api.md, "Proxy mode identity")
//
// The namespace of a keyed request comes from, in this order: NamespaceHeader
// (setting it declares that every caller reaches the proxy through a gateway
// that sets or overwrites that header: the proxy trusts it as sent); the
// verified TLS client certificate (idemrouter --certs-dir serves the proxy
// listener with TLS, client certificates optional and verified against the
// CA; an idem client certificate's namespace is its NAME); a keyed hash of
// the Authorization header (AuthorizationKey: "auth-" + 40 hex digits of
// HMAC-SHA256), so callers with different credentials never share a
// response; and only callers sending no Authorization at all share
// DefaultNamespace.
//
// # Forwarding
//
// Requests go to Upstream joined with the request path and query
// (ReverseProxy.SetURL), with the upstream's Host unless PreserveHost, and
// X-Forwarded-For/-Host/-Proto set by the proxy when XForwarded
// (DefaultConfig; the caller's own are replaced, since the proxy is the
// edge; without XForwarded they pass as sent). Hop-by-hop
// headers are dropped both ways, as RFC 9110 requires of a proxy. Other
// methods and key-less requests pass through untouched otherwise: their
// bodies stream, they have no size bound and no deadline but the caller's,
// and an Idempotency-Fencing-Token they carry is removed, as on every
// request, with every variant of its name that differs only in case or by
// '_' for '-' (only keyed requests get one: the proxy's own, set after
// hop-by-hop processing, so a Connection header naming it cannot strip it). A keyed request's body is read
// in full first (its fingerprint covers it): in memory up to
// SpoolThresholdBytes, in an unlinked temporary file beyond it; the upstream
// then gets it with a Content-Length.
//
// A keyed request reaches the upstream with the caller's Idempotency-Key
// header and Idempotency-Fencing-Token: <n>. The upstream's context is
// detached from the caller's, so a caller that hangs up does not abort the
// work: the answer is stored, and the caller's retry gets it. It ends at
// UpstreamTimeout.
//
// # Answers
//
//	case                                            answer
//	first request                                   upstream's status, headers, body (no Idempotent-Replayed); stored
//	same key while the first runs                   409 problem, Retry-After
//	same key and request after completion           stored response, Idempotent-Replayed: true
//	same key, other method/path/query/body          422 problem (running or completed)
//	no key, RequireKey                              400 problem; nothing reaches the upstream
//	invalid key (not 1-255 printable ASCII, two)    400 problem
//	NamespaceHeader set and missing / invalid       401 (WWW-Authenticate) / 400 problem
//	keyed body over MaxRequestBytes                 413 problem
//	upstream 5xx, 408, 425, 429 (ReleaseStatuses)   returned; key released, a retry runs again
//	upstream unreachable, or body broke off early   502 problem; key released
//	upstream past UpstreamTimeout                   504 problem; key released
//	store cannot decide (reserve)                   503 problem, Retry-After; nothing reaches the upstream
//	lease lost while the upstream works             503 problem; upstream request cancelled
//	other upstream answers (2xx, 3xx, other 4xx)    stored as final
//
// A final answer reaches the caller only after it is stored (up to
// MaxStoredBodyBytes of body; a longer one streams, and is stored without
// its body: replays carry Idempotent-Body-Omitted: true). Stored answers and
// their replays carry Idempotency-Key-Expires: <HTTP-date>, when the stored
// response stops being replayed (a streamed first answer cannot; its
// replays do). Set-Cookie reaches
// the first caller and is never stored or replayed. Problems are
// application/problem+json (RFC 9457) with type
// https://idem.dev/problems/<slug>, title, status and detail.
//
// # Metrics
//
// On Config.Registry:
//
//	idem_proxy_requests_total{outcome}       forwarded, replayed, conflict, mismatch, missing_key, released, passthrough, error
//	idem_proxy_upstream_duration_seconds     histogram: request sent upstream to the end of its response, every request
//	idem_proxy_stored_response_bytes         histogram: stored body sizes (0 when omitted)
//
// Stats returns the request counts as a struct.
package proxy
