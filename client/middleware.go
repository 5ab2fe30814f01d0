package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-dev/idem/httpidem"
)

// MiddlewareConfig configures Middleware. The zero value is the contract's
// proxy-mode behaviour: POST and PATCH with an Idempotency-Key are made
// idempotent, everything else passes through. A zero field takes the default
// named in its comment.
type MiddlewareConfig struct {
	// MiddlewarePolicy: which requests are handled, how callers are named,
	// the bounds, lease, retention and stored headers (the same struct as
	// the proxy's). Its fields are set directly (m.RequireKey = true).
	MiddlewarePolicy

	// Namespace, when set, names the caller of a request (its namespace, so
	// that two callers using the same key never see each other's responses);
	// typically from the request's authenticated identity. An error gives
	// 401, an invalid namespace 400. It takes precedence over
	// NamespaceHeader and client certificates.
	Namespace func(r *http.Request) (string, error)
	// Timeout is the deadline of the handler's context. That context is
	// detached from the caller's: a caller who hangs up does not cancel
	// work whose result its retry will want. Zero means 60s.
	Timeout time.Duration
	// Logger receives lease and store events. Nil means the Client's.
	Logger *slog.Logger
}

// MiddlewarePolicy is the HTTP engine's policy, shared with
// `idemrouter --upstream` (proxy.Policy): Methods, RequireKey,
// NamespaceHeader, CertNamespace, DefaultNamespace, MaxRequestBytes,
// SpoolThresholdBytes, SpoolDir, MaxStoredBodyBytes, Lease,
// HeartbeatInterval, StoreTimeout, Retention, ReleaseStatuses,
// FingerprintHeaders, StoredHeaderAllow and StoredHeaderDeny, each
// documented on the type. A zero field takes its default.
type MiddlewarePolicy = httpidem.Policy

// MiddlewareOption adjusts a MiddlewareConfig. Any func(*MiddlewareConfig)
// is one.
type MiddlewareOption func(*MiddlewareConfig)

// RequireKey makes a POST or PATCH without Idempotency-Key a 400.
func RequireKey() MiddlewareOption { return func(m *MiddlewareConfig) { m.RequireKey = true } }

// NamespaceHeader names the request header that carries the caller's
// namespace (401 when missing).
func NamespaceHeader(name string) MiddlewareOption {
	return func(m *MiddlewareConfig) { m.NamespaceHeader = name }
}

// NamespaceFunc derives the caller's namespace from the request.
func NamespaceFunc(fn func(r *http.Request) (string, error)) MiddlewareOption {
	return func(m *MiddlewareConfig) { m.Namespace = fn }
}

// Middleware returns net/http middleware that makes a handler's keyed POST
// and PATCH requests idempotent over c, with the same semantics as
// `idemrouter --upstream` (the contract's proxy mode) because both run the
// same engine (httpidem; its doc has the details):
//
//   - the first request with a key runs the handler, with an
//     Idempotency-Fencing-Token request header and the lease in its
//     context (FencingToken, LeaseFromContext), renewing the lease while it
//     runs; its response is stored and then sent;
//   - the same request again gets the stored response with
//     Idempotent-Replayed: true; while the first runs, 409; another request
//     with the key, 422 (all errors are application/problem+json); the
//     stored response and its replays carry Idempotency-Key-Expires, the
//     HTTP-date when it stops being replayed;
//   - a 5xx, 408, 425 or 429 response is sent and the key released, so a
//     retry runs the handler again; so is a handler that panics (the panic
//     goes on);
//   - a store that cannot decide gives 503, and the handler does not run.
//
// Handlers may write with Write, WriteHeader, Flush or ReadFrom (io.Copy);
// one that returns without writing sends 200 with an empty body. The
// response is held until stored, except that it streams once its body
// outgrows MaxStoredBodyBytes or a text/event-stream response flushes; other
// Flush calls are deferred. The writer does not support Hijack.
//
// Middleware panics if the options are invalid (as http.Handle panics on a
// bad pattern); NewMiddleware returns the error instead.
func Middleware(c *Client, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	mw, err := NewMiddleware(c, opts...)
	if err != nil {
		panic(err)
	}
	return mw
}

// NewMiddleware is Middleware, returning invalid options as an error (every
// problem at once, wrapping ErrInvalidArgument).
func NewMiddleware(c *Client, opts ...MiddlewareOption) (func(http.Handler) http.Handler, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: middleware: the Client is nil", ErrInvalidArgument)
	}
	var m MiddlewareConfig
	for _, opt := range opts {
		opt(&m)
	}
	logger := m.Logger
	if logger == nil {
		logger = c.log
	}
	cfg := httpidem.Config{
		Store:         engineStore{c: c},
		Policy:        m.MiddlewarePolicy,
		NamespaceFunc: m.Namespace,
		Timeout:       m.Timeout,
		Logger:        logger,
	}
	if problems := cfg.Problems(); len(problems) > 0 {
		errs := make([]error, len(problems))
		for i, p := range problems {
			errs[i] = fmt.Errorf("%w: middleware: %s", ErrInvalidArgument, p)
		}
		return nil, errors.Join(errs...)
	}
	engine, err := httpidem.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: middleware: %w", ErrInvalidArgument, err)
	}
	return engine.Handler, nil
}

// FencingToken returns the fencing token of the reservation the handler of
// ctx runs under (Middleware, UnaryServerInterceptor), or false outside one.
// Hand it to the systems the handler writes to, so they can refuse a write
// from an attempt that was replaced after its lease ran out.
func FencingToken(ctx context.Context) (uint64, bool) {
	l, ok := httpidem.LeaseFromContext(ctx)
	return l.FencingToken, ok
}

// LeaseFromContext returns what the handler of ctx knows of its reservation
// (Middleware, UnaryServerInterceptor): fencing token, whether an earlier
// attempt's lease ran out (Reclaimed), and the lease's end when the handler
// started. OwnerToken is empty: the middleware keeps the lease, completes
// and releases the key itself.
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	l, ok := httpidem.LeaseFromContext(ctx)
	if !ok {
		return Lease{}, false
	}
	return Lease{
		FencingToken:         l.FencingToken,
		Reclaimed:            l.Reclaimed,
		PreviousFencingToken: l.PreviousFencingToken,
		ExpiresAt:            l.ExpiresAt,
		OwnerToken:           l.OwnerToken,
	}, true
}
