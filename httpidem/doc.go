// Package httpidem makes HTTP handlers idempotent: wrap any net/http
// handler with an Engine over a Store, and a request carrying an
// Idempotency-Key runs the handler at most once per key; its retries get
// the stored response. It is the one engine behind idem's HTTP
// idempotency: the transparent proxy (package proxy, `idemrouter
// --upstream`) and the net/http middleware (client.Middleware) both wrap a
// handler with it, so that their semantics are the same by construction.
// It implements the "Proxy mode" section of docs/api.md over a small
// Store interface (reserve/heartbeat/complete/release); the proxy adapts a
// backend.Backend to it, the middleware a *client.Client.
//
// Most programs want client.Middleware, which builds the Engine over a
// *client.Client. Use this package directly to put the engine over another
// Store (a test double, a store of your own), to read the lease a handler
// runs under (LeaseFromContext), or to match the problem types
// (Problem* constants) and headers the engine sends. The package imports
// only the standard library and package contract.
//
// # The flow of a request
//
// A request whose method is not in Config.Methods (POST and PATCH by
// default), or that carries no Idempotency-Key, passes through untouched;
// with RequireKey, a keyless request of those methods gets 400 instead. For a
// keyed request:
//
//  1. The key is parsed (ParseKey: a structured-field string "k" or a bare
//     value; 1 to 255 bytes of printable ASCII; otherwise 400).
//  2. The caller's namespace is found: Config.NamespaceFunc, else the
//     Config.NamespaceHeader (missing: 401 with a WWW-Authenticate
//     challenge; not a valid namespace: 400), else a verified TLS client
//     certificate (NamespaceFromCert), else "default". Two callers using
//     the same key never see each other's responses.
//  3. The body is read in full, bounded by MaxRequestBytes (413 past it,
//     at once when Content-Length says so), while its fingerprint is
//     computed: SHA-256 over a version tag, the method, the escaped path,
//     the raw query (order matters), the FingerprintHeaders and the body,
//     each field length-prefixed ("sha256:" + 64 hex digits). Bodies over
//     SpoolThresholdBytes are spooled to an unlinked temporary file.
//  4. The key is reserved with a fresh owner token and the Lease. A store
//     failure gives 503 with Retry-After: the handler never runs without a
//     reservation. IN_PROGRESS gives 409 (Retry-After from the store's
//     hint), FINGERPRINT_MISMATCH 422, COMPLETED the stored response with
//     Idempotent-Replayed: true.
//  5. ACQUIRED or RECLAIMED: the handler runs with the body, the
//     Idempotency-Key header as the caller sent it, and
//     Idempotency-Fencing-Token: <n> (replacing any the caller sent); the
//     lease (LeaseFromContext) is in its context. The lease is renewed
//     every HeartbeatInterval. The handler's context is detached from the
//     caller's (a caller that hangs up does not abort work whose result its
//     retry will want), ends at Timeout, and is cancelled with cause
//     ErrLeaseLost if the lease is lost.
//  6. When the handler returns, a status in ReleaseStatuses (5xx, 408, 425,
//     429 by default) or a ForceRelease (the proxy's 502 and 504) releases
//     the key, so that a retry runs again; any other status is completed:
//     stored as final with its headers and body. A handler that panics has
//     its key released and the panic goes on.
//  7. Only then does the response reach the caller: a caller that has seen
//     an answer finds it stored when it retries.
//
// Every error the engine generates is application/problem+json (RFC 9457:
// type, title, status, detail); the type is ProblemTypeBase + a slug
// (Problem* constants).
//
// # Responses
//
// The handler writes to a capturing ResponseWriter that supports Write,
// WriteHeader, Flush (http.Flusher), io.ReaderFrom and the deadline methods
// of http.ResponseController, but not Hijack. 1xx responses (103 Early
// Hints) pass straight through. The response is held until it is stored,
// except that it starts streaming once its body outgrows
// MaxStoredBodyBytes, or on a Flush of a text/event-stream response; other
// Flush calls are deferred. A handler that writes nothing sends 200 with an
// empty body. A missing Content-Type is sniffed from the first bytes (as
// net/http would), so the caller and every replay get the same one. Writes
// to a caller that went away are swallowed so that the whole response is
// stored for the retry.
//
// A body larger than MaxStoredBodyBytes reaches the first caller in full and
// is stored without it; replays then carry Idempotent-Body-Omitted: true
// (the marker is stored as a header). The same happens when the store
// refuses the body as too large.
//
// A stored response carries Idempotency-Key-Expires, the HTTP-date when
// the store stops replaying it (the end of its retention, from the store's
// answer to the complete or the reserve), on the first answer and on every
// replay; a response that streamed before it was stored carries it on
// replays only, and an answer that was not stored (released, or the
// complete failed) carries none. The handler cannot set it.
//
// Stored and replayed headers are those the handler set (headers an outer
// middleware set before and the handler left alone are not stored), with
// multiple values joined with ", ", minus: the hop-by-hop headers
// (Connection and the headers it names, Keep-Alive, Proxy-Connection,
// Proxy-Authenticate, Proxy-Authorization, TE, Trailer, Transfer-Encoding,
// Upgrade), Set-Cookie and Set-Cookie2 (the first caller still gets them),
// Content-Length (recomputed on replay), Date (a replay is a new message,
// dated when it is sent), Idempotent-Replayed,
// Idempotent-Body-Omitted and Idempotency-Key-Expires, trailers, StoredHeaderDeny, and, when
// StoredHeaderAllow is set, every header it does not name. Headers beyond
// the store's bounds (100 headers, 256-byte names, 8 KiB values without
// control characters, 64 KiB in all) are left out with a warning. A
// record completed by another producer that holds any of the excluded
// headers is replayed without them.
//
// # Failures after the work
//
// A complete that answers NOT_OWNER (the lease was lost and another request
// reclaimed the key) or fails without a decision is logged; the caller still
// gets the handler's response. In the second case the key stays reserved
// until its lease runs out and the next request reclaims it, with a larger
// fencing token and Lease.Reclaimed set.
package httpidem
