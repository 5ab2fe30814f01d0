// Package server serves idem's public API (docs/api.md) over a Backend: the
// JSON HTTP API with /healthz, /readyz and /metrics, and the gRPC
// Idempotency service. It validates, applies defaults, encodes, maps errors
// and records request metrics; it executes nothing itself. The storage node
// implements Backend over its Raft shards, the router by forwarding.
//
// # Use
//
//	cfg := server.DefaultConfig()
//	cfg.Backend, cfg.Logger, cfg.Registry = backend, logger, registry
//	cfg.MaxResponseBytes = maxResponseBytes // --max-response-bytes
//	srv, err := server.New(cfg)
//	httpServer := &http.Server{Handler: srv.HTTPHandler()}
//	grpcServer := srv.NewGRPCServer() // Idempotency registered; register Admin too
//
// Both APIs share one validator (validate.go): the JSON path decodes a body
// into the same parameters the gRPC path reads from its message, and one
// function per command turns them into an fsm.Command. For a reserve without
// an owner token the server generates one (128 random bits, base64url, 22
// characters) before calling the Backend, so a forwarded or retried command
// stays idempotent downstream.
//
// # Errors
//
// Codes, HTTP statuses and gRPC codes:
//
//	code                HTTP  gRPC                 raised by
//	INVALID_ARGUMENT    400   InvalidArgument      validation
//	UNAUTHENTICATED     401   Unauthenticated      a Backend (*backend.Error)
//	PERMISSION_DENIED   403   PermissionDenied     a Backend (*backend.Error)
//	NOT_FOUND           404   NotFound             unknown path or verb, empty key, GET of an absent key
//	METHOD_NOT_ALLOWED  405   (none)               wrong HTTP method; see below
//	NOT_OWNER           409   FailedPrecondition   OutcomeNotOwner of heartbeat, complete, release
//	PAYLOAD_TOO_LARGE   413   ResourceExhausted    request body over MaxRequestBytes, response body over MaxResponseBytes
//	RESOURCE_EXHAUSTED  429   ResourceExhausted    a Backend (*backend.Error)
//	INTERNAL            500   Internal             OutcomeInvalid or an unexpected outcome, unknown Backend errors, panics
//	UNAVAILABLE         503   Unavailable          ErrUnavailable, *UnavailableError, *NotLeaderError, context deadline or cancellation
//
// HTTP errors are {"error": {"code": ..., "message": ...}} with Content-Type
// application/json. A message says what was wrong and what to do; all
// problems of one request are reported together, separated by "; ". Owner
// tokens are never echoed. INTERNAL messages never carry the cause (it goes
// to the log at ERROR). UNAVAILABLE (and any error with a RetryAfter) sets
// Retry-After in whole seconds, rounded up, at least 1 (1 when the Backend
// named no delay).
//
// Every gRPC error carries a google.rpc.ErrorInfo with domain ErrorDomain and
// the code as reason, and UNAVAILABLE a google.rpc.RetryInfo. A Backend
// returns only the closed set of package backend; one that forwards over
// gRPC (the router, a node's Forwarder) turns the status it got back into
// that set with wire.BackendError, which reads the ErrorInfo when present,
// so codes survive any number of hops (idemv1.StatusToError documents the
// mapping of a status without one). A *backend.Error picks the code itself.
//
// # Choices where the contract is silent
//
// Routing. The path is parsed raw (URL.EscapedPath), then the namespace and
// key are percent-decoded. For POST the verb follows the last ':' of the raw
// key segment; verbs are case-sensitive; an unknown verb is 404. GET takes
// the whole segment as the key (GET .../keys/a:reserve reads key
// "a:reserve"); HEAD is answered like GET. A key segment with an unencoded
// '/' is 404 (the contract says clients must encode '/'); an empty key is
// 404; an empty or malformed namespace is 400 INVALID_ARGUMENT. A wrong
// method is 405 with an Allow header and the error body with code
// METHOD_NOT_ALLOWED, the one code outside the contract's table: POST
// without a verb (Allow: GET, HEAD), PUT/DELETE/... on a key (Allow: GET,
// HEAD) or on a key with a verb (Allow: POST), and non-GET probes. Query
// strings are ignored.
//
// Request bodies. The Content-Type is not checked (curl -d sends
// form-urlencoded). An empty body is {}: fine for reserve, and for the other
// verbs a 400 naming the missing owner_token. Otherwise the body must be
// exactly one JSON object. Field names match exactly (case-sensitive, unlike
// encoding/json's default); an unknown field at the top level or inside
// "response" is 400 and the message lists the allowed fields. A null field
// counts as absent. Integers are JSON numbers (a quoted "100" is 400); a
// number with a fraction or exponent is accepted when its value is whole
// (30000.0, 3e4), since many encoders write numbers that way; 1000.5 is 400.
// A fingerprint is counted in Unicode characters. On complete, "response"
// and its "status" are required (status has no default). response.body
// accepts the standard or the URL-safe alphabet (chosen by the characters
// present; mixing them is 400), padded or unpadded; when padding is present
// it must be correct.
//
// Header bounds (the contract names none): at most 100 headers; a name is
// 1-256 bytes of RFC 9110 token characters; a value is at most 8 KiB and
// holds no control characters other than tab (so a replay can always be
// written back as a header; non-ASCII bytes are kept); names plus values
// total at most 64 KiB. Names and values are stored exactly as given.
//
// Sizes. MaxResponseBytes (default 1 MiB) bounds the decoded body: a larger
// one is 413. MaxRequestBytes bounds the JSON request body; by default it is
// derived from MaxResponseBytes (MaxRequestBytesFor: base64 of a max-size
// body, doubled for encoders that escape '/', plus 512 KiB for headers and
// fields), so that a valid complete always fits and any larger body is 413
// before it is parsed. gRPC accepts messages up to
// Config.GRPCMaxMessageBytes (max-size body plus 1 MiB, at least 4 MiB), so
// a body somewhat over the limit gets the same 413-style ResourceExhausted
// from validation; gRPC clients of the service should allow that size too.
//
// Responses. A reserve answers 200 with exactly the fields of its outcome;
// fencing tokens are decimal strings; times are RFC 3339 in UTC with a "Z"
// and as many fractional digits as needed (time.RFC3339Nano);
// retry_after_ms is rounded down, so it never points past the moment the
// key could be reclaimed; a stored response is {status, headers (always an
// object), body (padded standard base64, "" when empty)}. GET shows
// lease_expires_at for IN_PROGRESS and completed_at, expires_at and response
// for COMPLETED, never the owner token. Release answers {}. In gRPC, times
// are Timestamps and fencing tokens uint64; an empty key is INVALID_ARGUMENT
// (there is no path to be unknown).
//
// Leader hint. A node's answers for one key (reserve, heartbeat, complete,
// release, checkpoint, get; errors included) carry the Idem-Leader header
// (LeaderHeader): the JSON address, HOST:PORT as the topology's http_addr
// gives it (Config.LeaderAddr), of the node the backend named as the key's
// shard's leader. The JSON API forwards a call that reaches a follower to
// the leader over gRPC, which costs the follower a gRPC exchange and the
// caller a hop; a JSON client that sends a key's next calls (the complete
// after a reserve) to the hinted address skips it, as the Go client's
// leader routing does for gRPC. It is a hint: a call sent to any node is
// still answered. A router sends no hint (it is the recommended single
// entry for clients that keep no state; it forwards to the leader itself).
//
// Operator actions (v1.1). GET /v1/namespaces/{ns}/keys lists keys
// (query parameters state, older_than_s, limit 1..1000 default 100,
// page_token; unknown or repeated parameters are 400, as unknown body
// fields are); older_than_s compares with created_at (when the current
// owner reserved the key) by the shard leader's clock, for both states.
// POST .../keys/{key}:force-release and DELETE .../keys/{key} take
// {"reason": "..."}: the reason is optional here (at most 1024 characters of text
// without control characters; idemctl insists on one) and goes to the log
// only. A force-released key reads as IN_PROGRESS with its lease ended until
// the next reserve reclaims it, and a retried force-release answers 200 with
// the same previous_fencing_token. A COMPLETED key's force-release is 409
// FAILED_PRECONDITION (gRPC FAILED_PRECONDITION with reason
// FAILED_PRECONDITION in its ErrorInfo, which tells it from NOT_OWNER). The
// principal is "root" for every caller until authentication is wired
// (principalOf). Each action is logged at info ("operator action", with
// action, principal, namespace, key, reason, outcome; hops when forwarded)
// by every process it passes through, and counted there in
// idem_operator_actions_total{action,outcome,forwarded}. In secure mode a
// request's idem-hops, idem-leader and forwarded principal are honoured
// only from node and router peers (security/auth), so a client cannot pass an action
// off as forwarded.
//
// Waiting (v1.1). A reserve's wait_ms (0..30000) is validated here and
// travels as fsm.Command.Wait; the backend waits (see backend.Waiters).
//
// # Probes and metrics
//
// GET /healthz: 200 {"status":"ok","version":...} while the process runs.
// GET /readyz: 200 {"status":"ready"} when Backend.Ready returns nil within
// Config.ReadyTimeout, else 503 UNAVAILABLE whose message carries the reason.
// GET /metrics: the Prometheus text of Config.Registry.
//
// Request metrics, for both APIs (probes and /metrics are not counted):
//
//	idem_api_requests_total{api, endpoint, outcome}
//	idem_api_request_duration_seconds{api, endpoint}   histogram
//
// api is "http" or "grpc"; endpoint is reserve, heartbeat, complete,
// release, get, "unknown" (HTTP requests that match no endpoint), or for
// gRPC routing, batch, admin_<method> and "other";
// outcome is the reserve outcome (ACQUIRED, RECLAIMED, IN_PROGRESS,
// COMPLETED, FINGERPRINT_MISMATCH), OK for other successes, or the error
// code. No label of these carries a key or namespace. Each operation of a
// Batch RPC is counted (and timed) as its unary RPC, and the batch once as
// endpoint batch.
//
// Requests that name a valid namespace are also counted by namespace (for
// the console's traffic view), with a bounded label: the first
// MaxNamespaceLabels namespaces the process served keep their name, later
// ones count as OtherNamespace:
//
//	idem_api_namespace_requests_total{namespace, outcome}
//
// Batch (gRPC only) runs up to idemv1.MaxBatchOps operations, each through
// the interceptors registered for operations (idemv1.WithBatchOpInterceptor:
// this package's metrics interceptor, security/auth's authorization) and
// its unary handler, each in its own goroutine, and answers in order when
// all are done; the leader hint of each goes in its result's leader_id.
// More than MaxBatchOps operations is INVALID_ARGUMENT, more than
// MaxBatchBytes PAYLOAD_TOO_LARGE; results of operations that change
// nothing (get, a reserve answered COMPLETED) are withheld, largest first,
// when the response would exceed MaxBatchBytes, and the client sends them
// again alone.
//
// A panic in an HTTP handler, an ExtraRoutes handler or any gRPC method on a
// server built with GRPCServerOptions is recovered, logged with its stack at
// ERROR, and answered with INTERNAL; the process keeps serving.
package server
