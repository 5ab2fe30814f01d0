package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/api/openapi"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

// Endpoint names, as in metrics labels.
const (
	endpointReserve   = "reserve"
	endpointHeartbeat = "heartbeat"
	endpointComplete  = "complete"
	endpointRelease   = "release"
	endpointGet       = "get"
	endpointList      = "list"
	endpointForce     = "force_release"
	endpointDelete    = "delete"
	// v1.2.
	endpointCheckpoint = "checkpoint"
	endpointGetPolicy  = "get_policy"
	endpointSetPolicy  = "set_policy"
	endpointUnknown    = "unknown"
)

// outcomeOK labels a successful heartbeat, complete, release or get.
const outcomeOK = "OK"

// LeaderHeader is the JSON API's leader hint: on an answer for one key, the
// JSON address (HOST:PORT) of the node that leads the key's shard, as the
// answering node knows it (Config.LeaderAddr). A JSON client sends the key's
// next calls (the complete after a reserve, heartbeats, a release) to that
// address and skips the forwarding hop a follower pays; the header is a
// hint, so a call sent anywhere is still answered.
const LeaderHeader = "Idem-Leader"

var verbs = map[string]string{
	"reserve":   endpointReserve,
	"heartbeat": endpointHeartbeat,
	"complete":  endpointComplete,
	"release":   endpointRelease,
	// v1.1 operator action.
	"force-release": endpointForce,
	// v1.2.
	"checkpoint": endpointCheckpoint,
}

// batchVerbs are the verbs of POST /v1/namespaces/{ns}/keys:{verb} (v1.2).
var batchVerbs = map[string]string{
	"batch-reserve":  endpointBatchReserve,
	"batch-complete": endpointBatchComplete,
}

type httpAPI struct {
	s       *Server
	extra   *http.ServeMux // nil without ExtraRoutes
	metrics http.Handler
}

func (h *httpAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.EscapedPath()
	if raw == "/v1/topology" && h.s.cfg.Topology != nil {
		sw := &statusWriter{ResponseWriter: w}
		defer h.recoverPanic(sw, r, nil)
		h.s.cfg.Topology.ServeHTTP(sw, r)
		return
	}
	if strings.HasPrefix(raw, "/v1/") {
		h.serveAPI(w, r, raw)
		return
	}
	w = &statusWriter{ResponseWriter: w}
	defer h.recoverPanic(w, r, nil)
	switch {
	case raw == "/healthz" || raw == "/readyz" || raw == "/metrics" || raw == openapi.Path:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, errorf(CodeMethodNotAllowed, "%s %s is not allowed: use GET", r.Method, raw))
			return
		}
		switch raw {
		case "/healthz":
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": h.s.cfg.Version})
		case "/readyz":
			h.serveReady(w, r)
		case openapi.Path:
			openapi.ServeHTTP(w, r)
		default:
			h.metrics.ServeHTTP(w, r)
		}
		return
	}
	if h.extra != nil {
		if handler, pattern := h.extra.Handler(r); pattern != "" {
			handler.ServeHTTP(w, r)
			return
		}
	}
	writeError(w, errorf(CodeNotFound, "unknown path %q: %s", truncate(raw, 128), routesUsage))
}

// verbList is the verbs of POST .../keys/{key}:{verb} as a message lists
// them: ":reserve, :heartbeat, ... or :force-release".
func verbList() string {
	names := []string{"reserve", "heartbeat", "complete", "release", "checkpoint", "force-release"}
	for i, n := range names {
		names[i] = ":" + n
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// routesUsage is every route of the JSON API, for the message of an
// unknown path.
var routesUsage = "the API is GET or DELETE /v1/namespaces/{namespace}/keys/{key}; " +
	"POST /v1/namespaces/{namespace}/keys/{key}" + strings.ReplaceAll(strings.ReplaceAll(verbList(), ", ", "|"), " or ", "|") + "; " +
	"GET /v1/namespaces/{namespace}/keys (list); " +
	"POST /v1/namespaces/{namespace}/keys:batch-reserve|:batch-complete; " +
	"GET or PUT /v1/namespaces/{namespace}/policy; GET or PUT /v1/topology (nodes); " +
	"GET /healthz, /readyz, /metrics, /openapi.json"

func (h *httpAPI) serveReady(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.s.cfg.readyTimeout())
	defer cancel()
	if err := h.s.backend.Ready(ctx); err != nil {
		e := &Error{Code: CodeUnavailable, Message: "not ready: " + err.Error(), RetryAfter: defaultRetryAfter}
		writeError(w, e)
		return
	}
	if len(h.s.cfg.UnsafeSettings) > 0 {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "unsafe_settings": h.s.cfg.UnsafeSettings})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// statusWriter remembers whether the header went out, so that a recovered
// panic answers 500 only when it still can.
type statusWriter struct {
	http.ResponseWriter
	wroteHeader bool
	status      int // the status sent, 0 before the header went out
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status = code
	}
	w.wroteHeader = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.status = http.StatusOK
	}
	w.wroteHeader = true
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// recoverPanic turns a panic of a handler into 500 INTERNAL (when the header
// has not gone out yet) and a log line; the process keeps serving.
// http.ErrAbortHandler keeps its meaning: abort the response silently.
func (h *httpAPI) recoverPanic(w http.ResponseWriter, r *http.Request, outcome *string) {
	p := recover()
	if p == nil {
		return
	}
	if p == http.ErrAbortHandler {
		panic(p)
	}
	h.s.log.Error("panic in http handler", "method", r.Method, "path", r.URL.EscapedPath(),
		"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	if sw, ok := w.(*statusWriter); !ok || !sw.wroteHeader {
		writeError(w, &Error{Code: CodeInternal, Message: internalMessage})
	}
	if outcome != nil {
		*outcome = string(CodeInternal)
	}
}

// route is a parsed API path.
type route struct {
	endpoint       string
	namespace, key string
	// allow is the Allow header of a 405.
	allow string
}

// parseRoute parses the raw (still percent-encoded) path: the verb of a POST
// is what follows the last ':', so a ':' inside a key must be encoded as %3A
// only when the key would otherwise end in ":<verb>". The namespace and key
// are decoded afterwards.
func parseRoute(method, raw string) (route, *Error) {
	usage := routesUsage
	unknown := func() (route, *Error) {
		return route{endpoint: endpointUnknown}, errorf(CodeNotFound, "unknown path %q: %s", truncate(raw, 128), usage)
	}
	rest, ok := strings.CutPrefix(raw, "/v1/namespaces/")
	if !ok {
		return unknown()
	}
	rawNamespace, rest, ok := strings.Cut(rest, "/")
	if !ok {
		return unknown()
	}
	if rest == "keys" {
		return parseListRoute(method, rawNamespace)
	}
	if verb, ok := strings.CutPrefix(rest, "keys:"); ok {
		return parseBatchRoute(method, rawNamespace, verb)
	}
	if rest == "policy" {
		return parsePolicyRoute(method, rawNamespace)
	}
	rawKey, ok := strings.CutPrefix(rest, "keys/")
	if !ok {
		return unknown()
	}
	if strings.Contains(rawKey, "/") {
		return route{endpoint: endpointUnknown}, errorf(CodeNotFound,
			"unknown path %q: a key containing '/' must be percent-encoded as %%2F (and '%%' as %%25, '?' as %%3F, '#' as %%23)", truncate(raw, 128))
	}
	rt := route{}
	switch method {
	case http.MethodGet, http.MethodHead:
		rt.endpoint = endpointGet
	case http.MethodDelete:
		// A delete is not undone: a path that reads as a verb call
		// (.../keys/m1:reserve) is refused rather than taken as the key
		// "m1:reserve", as POST would read it.
		if i := strings.LastIndexByte(rawKey, ':'); i >= 0 && verbs[rawKey[i+1:]] != "" {
			return route{endpoint: endpointUnknown, allow: "POST"}, errorf(CodeMethodNotAllowed,
				"DELETE is not allowed on .../keys/{key}:%s, which is POST: to delete a key whose name ends in %q, percent-encode its ':' as %%3A",
				rawKey[i+1:], ":"+rawKey[i+1:])
		}
		rt.endpoint = endpointDelete
	case http.MethodPost:
		i := strings.LastIndexByte(rawKey, ':')
		if i < 0 {
			return route{endpoint: endpointUnknown, allow: "GET, HEAD, DELETE"}, &Error{Code: CodeMethodNotAllowed,
				Message: "POST needs a verb after the key: POST .../keys/{key}" + verbList() + "; reading a key is GET, deleting it DELETE"}
		}
		endpoint, ok := verbs[rawKey[i+1:]]
		if !ok {
			return route{endpoint: endpointUnknown}, errorf(CodeNotFound,
				"unknown verb %q: use %s (a ':' inside a key must be percent-encoded as %%3A)", truncate(rawKey[i+1:], 32), verbList())
		}
		rt.endpoint = endpoint
		rawKey = rawKey[:i]
	default:
		allow := "GET, HEAD, DELETE"
		if i := strings.LastIndexByte(rawKey, ':'); i >= 0 && verbs[rawKey[i+1:]] != "" {
			allow = "POST"
		}
		return route{endpoint: endpointUnknown, allow: allow}, &Error{Code: CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed here: use %s", method, allow)}
	}
	if rawKey == "" {
		return route{endpoint: rt.endpoint}, errorf(CodeNotFound, "the key is empty: %s", usage)
	}
	var p problems
	ns, err := url.PathUnescape(rawNamespace)
	if err != nil {
		p.addf("namespace is not validly percent-encoded: %s", namespaceRule)
	}
	key, err := url.PathUnescape(rawKey)
	if err != nil {
		p.addf("key is not validly percent-encoded (a '%%' in a key is %%25): %s", keyRule)
	}
	if e := p.err(); e != nil {
		return route{endpoint: rt.endpoint}, e
	}
	rt.namespace, rt.key = ns, key
	return rt, nil
}

// parseBatchRoute parses POST /v1/namespaces/{namespace}/keys:{verb}, a
// batch call.
func parseBatchRoute(method, rawNamespace, verb string) (route, *Error) {
	endpoint, ok := batchVerbs[verb]
	if !ok {
		return route{endpoint: endpointUnknown}, errorf(CodeNotFound,
			"unknown batch verb %q: use POST .../keys:batch-reserve or .../keys:batch-complete", truncate(verb, 32))
	}
	if method != http.MethodPost {
		return route{endpoint: endpoint, allow: "POST"}, &Error{Code: CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed here: batch calls are POST", method)}
	}
	ns, err := url.PathUnescape(rawNamespace)
	if err != nil {
		return route{endpoint: endpoint}, errorf(CodeInvalidArgument, "namespace is not validly percent-encoded: %s", namespaceRule)
	}
	return route{endpoint: endpoint, namespace: ns}, nil
}

// parseListRoute parses GET /v1/namespaces/{namespace}/keys, a listing.
func parseListRoute(method, rawNamespace string) (route, *Error) {
	if method != http.MethodGet && method != http.MethodHead {
		return route{endpoint: endpointUnknown, allow: "GET, HEAD"}, &Error{Code: CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed here: list the keys of a namespace with GET", method)}
	}
	ns, err := url.PathUnescape(rawNamespace)
	if err != nil {
		return route{endpoint: endpointList}, errorf(CodeInvalidArgument, "namespace is not validly percent-encoded: %s", namespaceRule)
	}
	return route{endpoint: endpointList, namespace: ns}, nil
}

// parsePolicyRoute parses GET and PUT /v1/namespaces/{namespace}/policy.
func parsePolicyRoute(method, rawNamespace string) (route, *Error) {
	rt := route{endpoint: endpointGetPolicy}
	switch method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPut:
		rt.endpoint = endpointSetPolicy
	default:
		return route{endpoint: endpointUnknown, allow: "GET, HEAD, PUT"}, &Error{Code: CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed here: read a namespace's policy with GET, set it with PUT", method)}
	}
	ns, err := url.PathUnescape(rawNamespace)
	if err != nil {
		return rt, errorf(CodeInvalidArgument, "namespace is not validly percent-encoded: %s", namespaceRule)
	}
	rt.namespace = ns
	return rt, nil
}

func (h *httpAPI) serveAPI(w http.ResponseWriter, r *http.Request, raw string) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	endpoint, outcome, namespace := endpointUnknown, "", ""
	var rt route
	if h.s.tracer != nil {
		var span *httpSpan
		r, span = h.s.startHTTPSpan(r)
		defer func() { span.end(rt, outcome, sw.status) }()
	}
	defer func() {
		h.s.metrics.observe("http", endpoint, outcome, time.Since(start))
		h.s.metrics.observeNamespace(namespace, outcome)
	}()
	defer h.recoverPanic(sw, r, &outcome)

	fail := func(e *Error) {
		outcome = string(e.Code)
		writeError(sw, e)
	}
	rt, e := parseRoute(r.Method, raw)
	endpoint = rt.endpoint
	if e == nil && contract.ValidNamespace(rt.namespace) {
		namespace = rt.namespace
	}
	if e != nil {
		if rt.allow != "" {
			sw.Header().Set("Allow", rt.allow)
		}
		fail(e)
		return
	}
	release, e := h.s.inflight.acquire(h.declaredBytes(r, rt))
	if e != nil {
		fail(e)
		return
	}
	defer release()
	switch endpoint {
	case endpointGet:
		outcome = h.serveGet(sw, r, rt, fail)
		return
	case endpointList:
		outcome = h.serveList(sw, r, rt, fail)
		return
	case endpointBatchReserve, endpointBatchComplete:
		outcome = h.serveBatch(sw, r, rt, fail)
		return
	case endpointGetPolicy:
		outcome = h.serveGetPolicy(sw, r, rt, fail)
		return
	}
	body, e := h.readBody(r, sw, endpoint)
	if e != nil {
		fail(e)
		return
	}
	switch endpoint {
	case endpointForce:
		outcome = h.serveOperator(sw, r, rt, fsm.OpForceRelease, body, fail)
		return
	case endpointDelete:
		outcome = h.serveOperator(sw, r, rt, fsm.OpDelete, body, fail)
		return
	case endpointSetPolicy:
		outcome = h.serveSetPolicy(sw, r, rt, body, fail)
		return
	}
	var cmd *fsm.Command
	switch endpoint {
	case endpointReserve:
		var params reserveParams
		if params, e = decodeReserve(body); e == nil {
			params.Namespace, params.Key = rt.namespace, rt.key
			cmd, e = h.s.validate.reserveCommand(params)
		}
	case endpointHeartbeat:
		var params heartbeatParams
		if params, e = decodeHeartbeat(body); e == nil {
			params.Namespace, params.Key = rt.namespace, rt.key
			cmd, e = h.s.validate.heartbeatCommand(params)
		}
	case endpointComplete:
		var params completeParams
		if params, e = decodeComplete(body); e == nil {
			params.Namespace, params.Key = rt.namespace, rt.key
			cmd, e = h.s.validate.completeCommand(params)
		}
	case endpointRelease:
		var params releaseParams
		if params, e = decodeRelease(body); e == nil {
			params.Namespace, params.Key = rt.namespace, rt.key
			cmd, e = h.s.validate.releaseCommand(params)
		}
	case endpointCheckpoint:
		var params checkpointParams
		if params, e = decodeCheckpoint(body); e == nil {
			params.Namespace, params.Key = rt.namespace, rt.key
			cmd, e = h.s.validate.checkpointCommand(params)
		}
	}
	if e != nil {
		fail(e)
		return
	}
	res, leader, e := h.s.applyRouted(r.Context(), cmd, 0)
	h.setLeader(sw, leader)
	if e != nil {
		fail(e)
		return
	}
	if cmd.Op == fsm.OpReserve {
		outcome = res.Outcome.String()
		writeReserve(sw, cmd, res)
		return
	}
	outcome = outcomeOK
	switch cmd.Op {
	case fsm.OpHeartbeat:
		out := heartbeatJSON{LeaseExpiresAt: formatTime(res.LeaseExpiresAt)}
		writeAppended(sw, http.StatusOK, func(b []byte) []byte { return appendHeartbeatJSON(b, out) })
	case fsm.OpComplete:
		out := completeJSON{CompletedAt: formatTime(res.CompletedAt), ExpiresAt: formatTime(res.ExpiresAt)}
		writeAppended(sw, http.StatusOK, func(b []byte) []byte { return appendCompleteJSON(b, out) })
	case fsm.OpCheckpoint:
		writeJSON(sw, http.StatusOK, checkpointedJSON{CheckpointedAt: formatTime(res.Checkpoint.At)})
	default:
		writeJSON(sw, http.StatusOK, struct{}{})
	}
}

// setLeader sets the LeaderHeader to the JSON address of node leader, when
// the server resolves addresses and knows it.
func (h *httpAPI) setLeader(w http.ResponseWriter, leader string) {
	if leader == "" || h.s.cfg.LeaderAddr == nil {
		return
	}
	if addr := h.s.cfg.LeaderAddr(leader); addr != "" {
		w.Header()[LeaderHeader] = []string{addr}
	}
}

// readAhead bounds what readAllLimited allocates for a body before its
// bytes arrive.
const readAhead = 64 << 10

// readAllLimited reads r's body, failing with *http.MaxBytesError past limit.
func readAllLimited(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, limit)
	n := r.ContentLength
	if n < 0 || n > limit {
		return io.ReadAll(body) // unknown length (chunked): grow as it comes
	}
	// The declared length, plus one byte for the read that meets EOF: one
	// allocation where io.ReadAll grows from 512 bytes (a complete with a
	// 512-byte response is ~800 bytes: three). Up to readAhead only: a
	// client that declares a large body and sends it slowly (or never)
	// does not get the server to allocate the whole of it before it
	// arrives. Past that, and if a reader ever returned more than declared
	// (net/http does not), the loop grows like io.ReadAll.
	b := make([]byte, 0, min(n, readAhead)+1)
	for {
		m, err := body.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// readBody reads the request body of endpoint up to MaxRequestBytes.
func (h *httpAPI) readBody(r *http.Request, w http.ResponseWriter, endpoint string) ([]byte, *Error) {
	limit := h.s.cfg.maxRequestBytes()
	tooLarge := func() *Error {
		if endpoint == endpointComplete {
			return errorf(CodePayloadTooLarge,
				"payload too large: a complete's request body is at most %d bytes, room for a stored response body of at most %d bytes (decoded, --max-response-bytes)",
				limit, h.s.validate.maxResponseBytes)
		}
		return errorf(CodePayloadTooLarge, "payload too large: a JSON request body is at most %d bytes", limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	body, err := readAllLimited(w, r, limit)
	if err != nil {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			return nil, tooLarge()
		}
		return nil, errorf(CodeInvalidArgument, "could not read the request body (%v): send it again", err)
	}
	return body, nil
}

func (h *httpAPI) serveGet(w http.ResponseWriter, r *http.Request, rt route, fail func(*Error)) (outcome string) {
	if e := h.s.validate.getParams(rt.namespace, rt.key); e != nil {
		fail(e)
		return string(e.Code)
	}
	rec, found, leader, e := h.s.getRouted(r.Context(), rt.namespace, rt.key, 0)
	h.setLeader(w, leader)
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	if !found {
		e := errorf(CodeNotFound, "no record for this key in namespace %q: it was never reserved, was released, or is past retention", rt.namespace)
		fail(e)
		return string(e.Code)
	}
	writeJSON(w, http.StatusOK, recordJSON(rec))
	return outcomeOK
}

// The JSON response bodies.
type (
	responseJSON struct {
		Status  int32             `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}
	reserveResponseJSON struct {
		Outcome              string          `json:"outcome"`
		OwnerToken           string          `json:"owner_token,omitempty"`
		FencingToken         string          `json:"fencing_token,omitempty"`
		PreviousFencingToken string          `json:"previous_fencing_token,omitempty"`
		LeaseExpiresAt       string          `json:"lease_expires_at,omitempty"`
		RetryAfterMs         *int64          `json:"retry_after_ms,omitempty"`
		Response             *responseJSON   `json:"response,omitempty"`
		CompletedAt          string          `json:"completed_at,omitempty"`
		ExpiresAt            string          `json:"expires_at,omitempty"`
		ExpiredAt            string          `json:"expired_at,omitempty"`
		Checkpoint           *checkpointJSON `json:"checkpoint,omitempty"`
	}
	checkpointJSON struct {
		Name           string `json:"name"`
		Data           string `json:"data"`
		FencingToken   string `json:"fencing_token"`
		CheckpointedAt string `json:"checkpointed_at"`
	}
	checkpointedJSON struct {
		CheckpointedAt string `json:"checkpointed_at"`
	}
	heartbeatJSON struct {
		LeaseExpiresAt string `json:"lease_expires_at"`
	}
	completeJSON struct {
		CompletedAt string `json:"completed_at"`
		ExpiresAt   string `json:"expires_at"`
	}
	getResponseJSON struct {
		State          string          `json:"state"`
		Fingerprint    string          `json:"fingerprint"`
		FencingToken   string          `json:"fencing_token"`
		LeaseExpiresAt string          `json:"lease_expires_at,omitempty"`
		CompletedAt    string          `json:"completed_at,omitempty"`
		ExpiresAt      string          `json:"expires_at,omitempty"`
		ExpiredAt      string          `json:"expired_at,omitempty"`
		Response       *responseJSON   `json:"response,omitempty"`
		Checkpoint     *checkpointJSON `json:"checkpoint,omitempty"`
	}
	errorBodyJSON struct {
		Error errorJSON `json:"error"`
	}
	errorJSON struct {
		Code    Code   `json:"code"`
		Message string `json:"message"`
	}
)

func reserveJSON(cmd *fsm.Command, res fsm.Result) reserveResponseJSON {
	out := reserveResponseJSON{Outcome: res.Outcome.String()}
	switch res.Outcome {
	case fsm.OutcomeAcquired, fsm.OutcomeReclaimed:
		out.OwnerToken = ownerTokenOf(cmd, res)
		out.FencingToken = formatToken(res.FencingToken)
		out.LeaseExpiresAt = formatTime(res.LeaseExpiresAt)
		if res.Outcome == fsm.OutcomeReclaimed {
			out.PreviousFencingToken = formatToken(res.PreviousFencingToken)
			out.Checkpoint = checkpointToJSON(res.Checkpoint)
		}
	case fsm.OutcomeExpired:
		out.FencingToken = formatToken(res.FencingToken)
		out.CompletedAt = formatTime(res.CompletedAt)
		out.ExpiredAt = formatTime(res.ExpiredAt)
	case fsm.OutcomeInProgress:
		ms := retryAfterMs(res.RetryAfter)
		out.RetryAfterMs = &ms
		out.LeaseExpiresAt = formatTime(res.LeaseExpiresAt)
	case fsm.OutcomeCompleted:
		out.FencingToken = formatToken(res.FencingToken)
		out.Response = storedResponseJSON(res.Response)
		out.CompletedAt = formatTime(res.CompletedAt)
		out.ExpiresAt = formatTime(res.ExpiresAt)
	}
	return out
}

// writeReserve writes a reserve's 200 answer.
func writeReserve(w http.ResponseWriter, cmd *fsm.Command, res fsm.Result) {
	out := reserveJSON(cmd, res)
	writeAppended(w, http.StatusOK, func(b []byte) []byte { return appendReserveJSON(b, &out) })
}

func recordJSON(rec fsm.Record) getResponseJSON {
	out := getResponseJSON{
		State:        rec.State.String(),
		Fingerprint:  rec.Fingerprint,
		FencingToken: formatToken(rec.FencingToken),
	}
	switch rec.State {
	case fsm.StateCompleted:
		out.CompletedAt = formatTime(rec.CompletedAt)
		out.ExpiresAt = formatTime(rec.ExpiresAt)
		out.Response = storedResponseJSON(rec.Response)
	case fsm.StateExpired:
		out.CompletedAt = formatTime(rec.CompletedAt)
		out.ExpiredAt = formatTime(rec.ExpiredAt)
	default:
		out.LeaseExpiresAt = formatTime(rec.LeaseExpiresAt)
		out.Checkpoint = checkpointToJSON(rec.Checkpoint)
	}
	return out
}

func checkpointToJSON(c *fsm.Checkpoint) *checkpointJSON {
	if c == nil {
		return nil
	}
	return &checkpointJSON{Name: c.Name, Data: base64.StdEncoding.EncodeToString(c.Data),
		FencingToken: formatToken(c.FencingToken), CheckpointedAt: formatTime(c.At)}
}

func storedResponseJSON(r *fsm.Response) *responseJSON {
	out := &responseJSON{Headers: map[string]string{}}
	if r == nil {
		return out
	}
	out.Status = r.Status
	for k, v := range r.Headers {
		out.Headers[k] = v
	}
	out.Body = base64.StdEncoding.EncodeToString(r.Body)
	return out
}

// ownerTokenOf is the token of an ACQUIRED/RECLAIMED answer: the backend's,
// or the command's (which the server set) if the backend left it out.
func ownerTokenOf(cmd *fsm.Command, res fsm.Result) string {
	if res.OwnerToken != "" {
		return res.OwnerToken
	}
	return cmd.OwnerToken
}

// retryAfterMs rounds the hint down, so that it never points past the moment
// the key could be reclaimed.
func retryAfterMs(retryAfter int64) int64 {
	return max(retryAfter/int64(time.Millisecond), 0)
}

func formatToken(t uint64) string { return strconv.FormatUint(t, 10) }

// formatTime formats Unix nanoseconds as RFC 3339 in UTC with the fractional
// seconds it needs.
func formatTime(unixNanos int64) string {
	return time.Unix(0, unixNanos).UTC().Format(time.RFC3339Nano)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only a programming error gets here: every body is a plain struct.
		status = http.StatusInternalServerError
		buf.Reset()
		_ = json.NewEncoder(&buf).Encode(errorBodyJSON{Error: errorJSON{Code: CodeInternal, Message: internalMessage}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// WriteHTTPError writes e as the JSON API's error body with its status (and
// Retry-After), for handlers served beside the API (Config.Topology).
func WriteHTTPError(w http.ResponseWriter, e *Error) { writeError(w, e) }

func writeError(w http.ResponseWriter, e *Error) {
	if e.RetryAfter > 0 || e.Code == CodeUnavailable {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(e.RetryAfter), 10))
	}
	writeJSON(w, e.Code.HTTPStatus(), errorBodyJSON{Error: errorJSON{Code: e.Code, Message: e.Message}})
}
