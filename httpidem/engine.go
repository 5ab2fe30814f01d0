package httpidem

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/leasekeep"
)

// Result is what became of one request; the proxy's
// idem_proxy_requests_total counts them by this label.
type Result string

// The results of a request.
const (
	// ResultForwarded: the handler ran under a reservation and its response
	// was final (stored, or meant to be: see the log when the store failed).
	ResultForwarded Result = "forwarded"
	// ResultReplayed: the key was completed before; the stored response was
	// replayed.
	ResultReplayed Result = "replayed"
	// ResultConflict: another request with the key was running (409).
	ResultConflict Result = "conflict"
	// ResultMismatch: the key was used for a different request (422).
	ResultMismatch Result = "mismatch"
	// ResultExpired: the key was used long ago and its stored response
	// expired; only a tombstone is left (410).
	ResultExpired Result = "expired"
	// ResultMissingKey: RequireKey and no key (400).
	ResultMissingKey Result = "missing_key"
	// ResultReleased: the handler ran and its response was not final (a
	// release status, or the proxy's 502/504); the key was released.
	ResultReleased Result = "released"
	// ResultPassthrough: another method, or no key; not handled.
	ResultPassthrough Result = "passthrough"
	// ResultError: the engine answered with an error of its own (invalid
	// key or namespace, 401, 413, store unavailable) or the handler
	// panicked.
	ResultError Result = "error"
)

// Results lists every Result, for metrics that start each label at zero.
var Results = []Result{ResultForwarded, ResultReplayed, ResultConflict, ResultMismatch, ResultExpired,
	ResultMissingKey, ResultReleased, ResultPassthrough, ResultError}

// Event reports one request to Config.Observe.
type Event struct {
	Result Result
	// HandlerDuration is how long the handler ran (0 when it did not run
	// under a reservation).
	HandlerDuration time.Duration
	// StoredBodyBytes is the size of the stored body (0 when it was
	// omitted), or -1 when nothing was stored.
	StoredBodyBytes int
}

// Engine makes the keyed requests of a handler idempotent. It is safe for
// concurrent use.
type Engine struct {
	cfg       Config
	log       *slog.Logger
	methods   map[string]bool
	release   StatusSet
	fpHeaders []string
	headers   headerPolicy
}

// New validates cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	release, _ := ParseStatusSet(cfg.ReleaseStatuses) // validated
	e := &Engine{
		cfg:       cfg,
		log:       cfg.Logger,
		methods:   make(map[string]bool),
		release:   release,
		fpHeaders: canonicalHeaders(cfg.FingerprintHeaders),
		headers:   newHeaderPolicy(cfg.StoredHeaderAllow, cfg.StoredHeaderDeny),
	}
	for _, m := range cfg.Methods {
		e.methods[m] = true
	}
	return e, nil
}

// Handler returns next wrapped by the engine.
func (e *Engine) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.serve(w, r, next) })
}

func (e *Engine) observe(ev Event) {
	if e.cfg.Observe != nil {
		e.cfg.Observe(ev)
	}
}

func (e *Engine) fail(w http.ResponseWriter, result Result, p Problem) {
	WriteProblem(w, p)
	e.observe(Event{Result: result, StoredBodyBytes: -1})
}

func (e *Engine) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	StripFencingHeaders(r.Header) // keyed or not, only the engine sets one
	if !e.methods[r.Method] {
		e.observe(Event{Result: ResultPassthrough, StoredBodyBytes: -1})
		next.ServeHTTP(w, r)
		return
	}
	key, present, err := ParseKey(r.Header.Values(HeaderKey))
	if err != nil {
		e.fail(w, ResultError, NewProblem(http.StatusBadRequest, ProblemInvalidKey, err.Error()))
		return
	}
	if !present {
		if e.cfg.RequireKey {
			e.fail(w, ResultMissingKey, NewProblem(http.StatusBadRequest, ProblemMissingKey, fmt.Sprintf(
				"%s requests here need an %s header: send a unique key (a UUID, say) and the same key with every retry of the request",
				r.Method, HeaderKey)))
			return
		}
		e.observe(Event{Result: ResultPassthrough, StoredBodyBytes: -1})
		next.ServeHTTP(w, r)
		return
	}
	ns, prob := e.namespace(r)
	if prob != nil {
		e.fail(w, ResultError, *prob)
		return
	}
	if r.ContentLength > e.cfg.MaxRequestBytes {
		e.fail(w, ResultError, tooLarge(e.cfg.MaxRequestBytes))
		return
	}

	h := newFingerprintHash(r, e.fpHeaders)
	src := r.Body
	if src == nil {
		src = http.NoBody
	}
	b, err := readBody(src, e.cfg.MaxRequestBytes, e.cfg.SpoolThresholdBytes, e.cfg.SpoolDir, h)
	switch {
	case errors.Is(err, errBodyTooLarge):
		e.fail(w, ResultError, tooLarge(e.cfg.MaxRequestBytes))
		return
	case errors.Is(err, errSpool):
		e.log.Error("cannot spool a request body", "namespace", ns, "key", key, "err", err)
		e.fail(w, ResultError, NewProblem(http.StatusInternalServerError, ProblemInternal, "the request body could not be buffered; try again later"))
		return
	case err != nil:
		e.fail(w, ResultError, NewProblem(http.StatusBadRequest, ProblemUnreadableBody, "reading the request body failed: "+err.Error()))
		return
	}
	defer b.close()

	ref := Ref{Namespace: ns, Key: key, OwnerToken: NewOwnerToken()}
	wait := e.preferredWait(r)
	sentAt := time.Now()
	// A waiting reserve is held by the store on purpose: the wait adds to
	// the store call's bound. A caller that goes away ends the wait.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), e.cfg.StoreTimeout+wait)
	if wait > 0 {
		stop := context.AfterFunc(r.Context(), cancel)
		defer stop()
	}
	res, err := e.cfg.Store.Reserve(ctx, ReserveRequest{Ref: ref, Fingerprint: fingerprintOf(h), Lease: e.cfg.Lease, Wait: wait})
	cancel()
	if err != nil && wait > 0 && r.Context().Err() != nil {
		e.observe(Event{Result: ResultError, StoredBodyBytes: -1})
		return // the caller left while waiting: nobody to answer
	}
	if err != nil {
		if errors.Is(err, ErrInvalid) {
			e.log.Error("the store refused a reserve", "namespace", ns, "key", key, "err", err)
			e.fail(w, ResultError, NewProblem(http.StatusInternalServerError, ProblemInternal, "the idempotency store refused the reservation"))
			return
		}
		e.log.Warn("reserve failed; answering 503", "namespace", ns, "key", key, "err", err)
		p := NewProblem(http.StatusServiceUnavailable, ProblemStoreUnavailable,
			"the idempotency store could not decide in time, so the request was not run: retry it with the same Idempotency-Key after Retry-After")
		p.RetryAfter = time.Second
		e.fail(w, ResultError, p)
		return
	}

	switch res.Outcome {
	case contract.OutcomeAcquired, contract.OutcomeReclaimed:
		e.run(w, r, next, ref, res, b, sentAt)
	case contract.OutcomeCompleted:
		if res.Response == nil {
			e.log.Error("the store answered COMPLETED without a response", "namespace", ns, "key", key)
			e.fail(w, ResultError, NewProblem(http.StatusInternalServerError, ProblemInternal, "the idempotency store answered without the stored response"))
			return
		}
		e.replay(w, ns, key, *res.Response, res.ExpiresAt)
	case contract.OutcomeInProgress:
		msg := "another request with this Idempotency-Key is running: retry after Retry-After to get its response"
		if wait > 0 {
			msg = fmt.Sprintf("another request with this Idempotency-Key is still running after waiting %v for it: retry after Retry-After to get its response", wait)
		}
		p := NewProblem(http.StatusConflict, ProblemInProgress, msg)
		p.RetryAfter = max(res.RetryAfter, time.Second)
		e.fail(w, ResultConflict, p)
	case contract.OutcomeFingerprintMismatch:
		e.fail(w, ResultMismatch, NewProblem(http.StatusUnprocessableEntity, ProblemFingerprintMismatch,
			"this Idempotency-Key was used for a request with another method, path, query or body: use a new key for a new request"))
	case contract.OutcomeExpired:
		// The request ran long ago; its response is past retention. Nothing
		// reaches the handler or the upstream.
		e.fail(w, ResultExpired, NewProblem(http.StatusGone, ProblemExpired, fmt.Sprintf(
			"this Idempotency-Key was used for a request completed at %s; its stored response expired at %s and is gone: the request is not run again, use a new key for a new request",
			res.CompletedAt.UTC().Format(time.RFC3339), res.ExpiredAt.UTC().Format(time.RFC3339))))
	default:
		e.log.Error("the store answered an unknown outcome", "namespace", ns, "key", key, "outcome", res.Outcome.String())
		e.fail(w, ResultError, NewProblem(http.StatusInternalServerError, ProblemInternal, "the idempotency store answered an unknown outcome"))
	}
}

func tooLarge(limit int64) Problem {
	return NewProblem(http.StatusRequestEntityTooLarge, ProblemRequestTooLarge,
		fmt.Sprintf("a request with an Idempotency-Key may carry at most %d bytes of body", limit))
}

// namespace names the caller of r (see Config). A problem means the request
// must not go further.
func (e *Engine) namespace(r *http.Request) (string, *Problem) {
	unauthenticated := func(detail string) (string, *Problem) {
		p := NewProblem(http.StatusUnauthorized, ProblemMissingIdentity, detail)
		challenge := `Namespace realm="idem"`
		if e.cfg.NamespaceHeader != "" {
			challenge += fmt.Sprintf(", header=%q", e.cfg.NamespaceHeader)
		}
		p.Header = http.Header{"Www-Authenticate": {challenge}}
		return "", &p
	}
	var ns string
	switch {
	case e.cfg.NamespaceFunc != nil:
		v, err := e.cfg.NamespaceFunc(r)
		if err != nil {
			return unauthenticated("the caller could not be identified: " + err.Error())
		}
		ns = v
	case e.cfg.NamespaceHeader != "":
		values := r.Header.Values(e.cfg.NamespaceHeader)
		if len(values) == 0 || values[0] == "" {
			return unauthenticated(fmt.Sprintf("requests with an %s must name their caller in the %s header", HeaderKey, e.cfg.NamespaceHeader))
		}
		if len(values) > 1 {
			p := NewProblem(http.StatusBadRequest, ProblemInvalidNamespace, fmt.Sprintf("send exactly one %s header", e.cfg.NamespaceHeader))
			return "", &p
		}
		ns = values[0]
	case r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0:
		derive := e.cfg.CertNamespace
		if derive == nil {
			derive = NamespaceFromCert
		}
		v, err := derive(r.TLS.VerifiedChains[0][0])
		if err != nil {
			return unauthenticated("no namespace for the client certificate: " + err.Error())
		}
		ns = v
	case len(e.cfg.AuthorizationKey) > 0 && len(r.Header.Values("Authorization")) > 0:
		ns = AuthorizationNamespace(e.cfg.AuthorizationKey, r.Header.Values("Authorization"))
	default:
		ns = e.cfg.DefaultNamespace
	}
	if !ValidNamespace(ns) {
		shown := ns
		if len(shown) > 64 {
			shown = shown[:64] + "..."
		}
		p := NewProblem(http.StatusBadRequest, ProblemInvalidNamespace, fmt.Sprintf(
			"the caller namespace %q is not valid: use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", shown))
		return "", &p
	}
	return ns, nil
}

// AuthorizationNamespace is the namespace of a caller known only by its
// Authorization header values: "auth-" and the first 40 hex digits of
// HMAC-SHA256(key, the values joined by newlines).
func AuthorizationNamespace(key []byte, values []string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(strings.Join(values, "\n")))
	return "auth-" + hex.EncodeToString(m.Sum(nil))[:40]
}

// storeContext bounds a store call by StoreTimeout, detached from the
// caller: a caller that goes away must not leave a reservation half made.
func (e *Engine) storeContext(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(parent), e.cfg.StoreTimeout)
}

// replay writes a stored response with Idempotent-Replayed: true and, when
// the store said, Idempotency-Key-Expires.
func (e *Engine) replay(w http.ResponseWriter, ns, key string, resp Response, expiresAt time.Time) {
	if resp.Status < 200 || resp.Status > 599 {
		e.log.Error("stored response has a status that cannot be replayed", "namespace", ns, "key", key, "status", resp.Status)
		e.fail(w, ResultError, NewProblem(http.StatusInternalServerError, ProblemInternal, "the stored response cannot be replayed"))
		return
	}
	h := w.Header()
	for name, values := range replayedHeaders(resp.Headers) {
		h[name] = values
	}
	h.Set(HeaderReplayed, "true")
	setExpires(h, expiresAt)
	w.WriteHeader(resp.Status)
	if len(resp.Body) > 0 && bodyAllowed(resp.Status) {
		_, _ = w.Write(resp.Body)
	}
	e.observe(Event{Result: ResultReplayed, StoredBodyBytes: -1})
}

// run runs next while holding the key, then completes or releases it, and
// only then lets the held response go to the caller.
func (e *Engine) run(w http.ResponseWriter, r *http.Request, next http.Handler, ref Ref, res Reservation, b *body, sentAt time.Time) {
	st := &runState{lease: Lease{
		Namespace:            ref.Namespace,
		Key:                  ref.Key,
		FencingToken:         res.FencingToken,
		Reclaimed:            res.Outcome == contract.OutcomeReclaimed,
		PreviousFencingToken: res.PreviousFencingToken,
		ExpiresAt:            res.LeaseExpiresAt,
	}}
	log := e.log.With("namespace", ref.Namespace, "key", ref.Key, "fencing_token", res.FencingToken)
	if st.lease.Reclaimed {
		log.Info("reclaimed a key whose earlier attempt's lease ran out; that attempt may have done part of the work",
			"previous_fencing_token", res.PreviousFencingToken)
	}

	// The work runs to its end even if the caller goes away: its response is
	// stored for the caller's retry. It ends at Timeout, or when the lease
	// is lost (cause ErrLeaseLost).
	runCtx, loseLease := context.WithCancelCause(context.WithValue(context.WithoutCancel(r.Context()), runKey{}, st))
	defer loseLease(nil)
	handlerCtx, cancelTimeout := context.WithTimeout(runCtx, e.cfg.Timeout)
	defer cancelTimeout()

	out := r.Clone(handlerCtx)
	out.Body = b.reader()
	out.ContentLength = b.size
	out.TransferEncoding = nil
	out.GetBody = func() (io.ReadCloser, error) { return b.reader(), nil }
	out.Header.Set(HeaderFencingToken, strconv.FormatUint(res.FencingToken, 10))
	out.Header.Del("Expect")             // the body is here already
	if out.Header.Get("Upgrade") != "" { // a keyed response cannot switch protocols: it must be stored
		out.Header.Del("Upgrade")
		out.Header.Del("Connection")
	}

	hbCtx, stopHeartbeats := context.WithCancel(runCtx)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		// The lease counts from the store's apply, after sentAt: measured
		// from sentAt by our clock it ends early, never late.
		lease := e.cfg.Lease
		if res.Lease > 0 && res.Lease < lease {
			lease = res.Lease // a namespace policy's max_lease
		}
		e.keepLease(hbCtx, loseLease, log, ref, lease, sentAt.Add(lease))
	}()
	stop := func() {
		stopHeartbeats()
		<-hbDone
	}

	cw := newCaptureWriter(w, e.cfg.MaxStoredBodyBytes)
	start := time.Now()
	returned := false
	defer func() {
		if returned {
			return
		}
		// next panicked: free the key so that a retry runs again, and let
		// the panic go on (net/http aborts the connection).
		stop()
		e.releaseKey(r.Context(), log, ref)
		e.observe(Event{Result: ResultError, HandlerDuration: time.Since(start), StoredBodyBytes: -1})
	}()
	next.ServeHTTP(cw, out)
	returned = true
	elapsed := time.Since(start)
	stop()
	cw.finalize(nil)

	var done Completion // zero unless stored
	if st.forceRelease.Load() || e.release.Has(cw.status) {
		e.releaseKey(r.Context(), log, ref)
		e.observe(Event{Result: ResultReleased, HandlerDuration: elapsed, StoredBodyBytes: -1})
	} else {
		var stored int
		stored, done = e.complete(r.Context(), log, ref, cw)
		e.observe(Event{Result: ResultForwarded, HandlerDuration: elapsed, StoredBodyBytes: stored})
	}
	if !cw.committed {
		// Only the engine says when a stored response expires. A response
		// that streamed before it was stored (a body over the limit, an
		// event stream) carries the header on replays only.
		setExpires(cw.sent, done.ExpiresAt)
	}
	cw.deliver()
}

// setExpires sets Idempotency-Key-Expires to expiresAt (unknown: zero,
// and then the header is removed).
func setExpires(h http.Header, expiresAt time.Time) {
	if expiresAt.IsZero() {
		h.Del(HeaderKeyExpires)
		return
	}
	h.Set(HeaderKeyExpires, expiresAt.UTC().Format(http.TimeFormat))
}

// complete stores the captured response and returns the stored body's size
// (-1 when nothing was stored) and the store's answer. A body over MaxStoredBodyBytes, or one the
// store refuses as too large, is stored without its body and marked with
// Idempotent-Body-Omitted.
func (e *Engine) complete(parent context.Context, log *slog.Logger, ref Ref, cw *captureWriter) (int, Completion) {
	headers, dropped := e.headers.stored(cw.sent, cw.base)
	if len(dropped) > 0 {
		log.Warn("response headers beyond the store's bounds are not stored; replays lack them", "headers", dropped)
	}
	resp := Response{Status: cw.status, Headers: headers}
	if cw.overflow {
		resp.Headers[HeaderBodyOmitted] = "true"
	} else {
		resp.Body = cw.buf.Bytes()
	}
	ctx, cancel := e.storeContext(parent)
	defer cancel()
	done, err := e.cfg.Store.Complete(ctx, ref, resp, e.cfg.Retention)
	if errors.Is(err, ErrTooLarge) && !cw.overflow {
		log.Warn("the store refused the response body as too large; storing it without the body (set MaxStoredBodyBytes to the store's --max-response-bytes)",
			"body_bytes", len(resp.Body))
		resp.Body = nil
		resp.Headers[HeaderBodyOmitted] = "true"
		done, err = e.cfg.Store.Complete(ctx, ref, resp, e.cfg.Retention)
	}
	switch {
	case err == nil:
		return len(resp.Body), done
	case errors.Is(err, ErrNotOwner):
		log.Warn("lease lost: another request reclaimed the key while this one ran, so its response is not stored", "err", err)
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrTooLarge):
		log.Error("the store refused the response; releasing the key so that a retry runs again", "err", err)
		e.releaseKey(parent, log, ref)
	default:
		log.Error("completing failed; the key stays reserved until its lease runs out, and the next request with it reclaims it", "err", err)
	}
	return -1, Completion{}
}

// releaseKey frees the key; a failure leaves it reserved until its lease
// runs out.
func (e *Engine) releaseKey(parent context.Context, log *slog.Logger, ref Ref) {
	ctx, cancel := e.storeContext(parent)
	defer cancel()
	if err := e.cfg.Store.Release(ctx, ref); err != nil && !errors.Is(err, ErrNotOwner) {
		log.Warn("release failed; the key stays reserved until its lease runs out", "err", err)
	}
}

// keepLease renews the lease every HeartbeatInterval until ctx ends. It
// cancels the run with ErrLeaseLost when a renewal answers NOT_OWNER, or
// when renewals keep failing until localEnd, the lease's end by our clock.
func (e *Engine) keepLease(ctx context.Context, lost context.CancelCauseFunc, log *slog.Logger, ref Ref, lease time.Duration, localEnd time.Time) {
	leasekeep.Keep(ctx, lost, leasekeep.Lease{
		Length:       lease,
		Interval:     min(e.cfg.HeartbeatInterval, lease/3),
		End:          localEnd,
		Timeout:      e.cfg.StoreTimeout,
		Renew:        func(ctx context.Context) error { return e.cfg.Store.Heartbeat(ctx, ref, lease) },
		ErrNotOwner:  ErrNotOwner,
		ErrLeaseLost: ErrLeaseLost,
		Taken:        "lease lost: another request holds the key",
		Log:          log,
	})
}
