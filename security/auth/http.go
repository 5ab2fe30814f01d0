package auth

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/idem-dev/idem/security/pki"
)

// ForwardedPrincipalHeader carries, on a request one node or router
// forwards to another over mTLS, the principal the first one authenticated.
// A receiver honours it only from a verified node or router certificate;
// from anyone
// else it is ignored (and the middleware strips it).
const ForwardedPrincipalHeader = "Idem-Forwarded-Principal"

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal the middleware or interceptor put in
// ctx (for logs of operator actions, and for forwarding).
func PrincipalFrom(ctx context.Context) (*Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(*Principal)
	return p, ok
}

// PeerIdentity returns the idem identity of the verified client certificate
// of a TLS connection; the zero Identity when there is none (plaintext, no
// certificate) or it is no idem certificate. Only VerifiedChains count: a
// certificate the handshake did not verify names no one.
func PeerIdentity(cs *tls.ConnectionState) pki.Identity {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return pki.Identity{}
	}
	id, err := pki.Identify(cs.VerifiedChains[0][0])
	if err != nil {
		return pki.Identity{}
	}
	return id
}

// CredentialsFromHTTP collects what r presents: its verified client
// certificate, its Authorization header, and, from a node or router peer only, the
// forwarded principal.
func CredentialsFromHTTP(r *http.Request) Credentials {
	c := Credentials{Peer: PeerIdentity(r.TLS), Authorization: r.Header.Get("Authorization")}
	if c.Peer.Kind.Peer() {
		c.Forwarded = r.Header.Get(ForwardedPrincipalHeader)
	}
	return c
}

// TargetFunc classifies a request; ok=false means it needs no credentials
// (the probes). JSONAPITarget is the JSON API's.
type TargetFunc func(r *http.Request) (t Target, ok bool)

// ErrorWriter writes a refusal; WriteJSONError is the JSON API's, the proxy
// passes one that writes application/problem+json.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, e *Error)

// Middleware checks every request before next sees it: the probes (target
// ok=false) pass untouched; any other request needs Authorize to allow it,
// else writeErr (nil: WriteJSONError) answers 401, 403 or 429 with
// Retry-After. An allowed request reaches next with its principal in the
// context (PrincipalFrom) and without a forwarded-principal header a
// non-node sent.
func (a *Authorizer) Middleware(next http.Handler, target TargetFunc, writeErr ErrorWriter) http.Handler {
	if writeErr == nil {
		writeErr = WriteJSONError
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, need := target(r)
		if !need {
			next.ServeHTTP(w, r)
			return
		}
		creds := CredentialsFromHTTP(r)
		batch := isBatchCall(r)
		cost := 1
		if batch {
			cost = 0 // BatchCharge: once the handler counted the items
		}
		p, err := a.authorize(creds, t, cost)
		if err != nil {
			writeErr(w, r, err.(*Error))
			return
		}
		ctx := a.withWaitCharge(WithPrincipal(r.Context(), p), p)
		if batch {
			// A batch call of N items is charged N, all at once, before
			// its items are parsed: the handler calls BatchCharge.
			ctx = context.WithValue(ctx, batchChargeKey{}, func(items int) error {
				_, err := a.authorize(creds, t, max(items, 1))
				return err
			})
		}
		if creds.Forwarded == "" && r.Header.Get(ForwardedPrincipalHeader) != "" {
			r = r.Clone(r.Context())
			r.Header.Del(ForwardedPrincipalHeader)
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

type batchChargeKey struct{}

// isBatchCall reports whether r is a JSON batch call (keys:batch-reserve,
// keys:batch-complete), which is charged its item count.
func isBatchCall(r *http.Request) bool {
	return r.Method == http.MethodPost && (strings.HasSuffix(r.URL.Path, "/keys:batch-reserve") || strings.HasSuffix(r.URL.Path, "/keys:batch-complete"))
}

// BatchCharge charges the batch call of ctx its item count (at least one:
// a body without items is still a call) against its principal's rate, all
// at once, before its items are decoded: nil, or the *Error (429 with
// RetryAfter) that refuses the whole call. Valid or not, every item pays.
// ok is false outside a batch call that Middleware let through.
func BatchCharge(ctx context.Context) (charge func(items int) error, ok bool) {
	charge, ok = ctx.Value(batchChargeKey{}).(func(int) error)
	return charge, ok
}

// WriteJSONError writes e as the JSON API's error body,
// {"error": {"code", "message"}}, with Retry-After on a 429.
func WriteJSONError(w http.ResponseWriter, _ *http.Request, e *Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if e.Code == CodeUnauthenticated {
		h.Set("WWW-Authenticate", `Bearer realm="idem"`)
	}
	if e.Code == CodeResourceExhausted {
		h.Set("Retry-After", strconv.FormatInt(e.RetryAfterSeconds(), 10))
	}
	w.WriteHeader(e.HTTPStatus())
	body := map[string]map[string]string{"error": {"code": e.Code, "message": e.Message}}
	_ = json.NewEncoder(w).Encode(body)
}

// ForwardHTTP sets the forwarded-principal header on an outgoing request
// that a node or router forwards (over mTLS with its own certificate) for
// the principal in ctx. Internal principals are not forwarded: the next hop
// sees the node itself.
func ForwardHTTP(ctx context.Context, out *http.Request) {
	out.Header.Del(ForwardedPrincipalHeader)
	if p, ok := PrincipalFrom(ctx); ok && !p.Internal {
		out.Header.Set(ForwardedPrincipalHeader, p.Name)
	}
}
