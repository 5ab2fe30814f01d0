package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/security/pki"
)

// Config configures an Authorizer.
type Config struct {
	// File is the auth file (--auth-file). Empty means no auth file: every
	// caller is the principal root (admin on "*"), as the contract says of
	// a process without --auth-file, unless RequireCertificate.
	File string
	// RequireCertificate, without an auth file (a secure process started
	// without --auth-file), accepts only callers that present a client
	// certificate of the CA (the principal its name, admin on "*") or a node
	// certificate (with the principal it forwards, or as itself); every
	// other caller gets 401. It keeps a secure router without an auth file
	// from making anonymous callers root at the nodes.
	RequireCertificate bool
	// Logger receives reload events; nil discards them.
	Logger *slog.Logger
	// Registry receives idem_auth_* metrics; nil means none (Stats works).
	Registry *prometheus.Registry
	// Now is the clock of the rate limiter (tests); nil means time.Now.
	Now func() time.Time
}

// Credentials are what a request presents; CredentialsFromHTTP and
// CredentialsFromGRPC build them.
type Credentials struct {
	// Peer is the identity of the verified TLS client certificate; its Kind
	// is zero when none was presented.
	Peer pki.Identity
	// Authorization is the raw Authorization header (gRPC: the
	// "authorization" metadata), "" when absent.
	Authorization string
	// Forwarded is the principal a node asserts for a request it forwards;
	// it is honoured only when Peer is a node (see SECURITY.md).
	Forwarded string
}

// Authorizer maps credentials to a principal and decides what it may do.
// It is safe for concurrent use; Reload swaps the policy atomically.
type Authorizer struct {
	cfg     Config
	logger  *slog.Logger
	state   atomic.Pointer[state]
	mu      sync.Mutex // serialises Reload
	metrics *metrics
	// member, once a node sets it (SetNodeMembership), tells whether a
	// node certificate's id is a node of the committed topology.
	member atomic.Pointer[func(id string) bool]
}

// SetNodeMembership tells the authorizer which node certificates name a
// node of the cluster: member reports whether id is a node of the
// committed topology (active, or the target of a running change). A node
// certificate for any other id is no node here: it is taken as a router
// (it may forward its caller's principal, as a v1.1 router given a node
// certificate does; its own identity is a router's), never as a node, so
// its own calls get none of a node's rights. A node sets it once it knows
// its topology; a router, which knows none, leaves it unset (every node
// certificate of the CA is then a node). member must be cheap and safe for
// concurrent use.
func (a *Authorizer) SetNodeMembership(member func(id string) bool) {
	a.member.Store(&member)
}

// outsider reports whether c's peer holds a node certificate for an id
// outside the committed topology.
func (a *Authorizer) outsider(c Credentials) bool {
	if c.Peer.Kind != pki.KindNode {
		return false
	}
	m := a.member.Load()
	return m != nil && !(*m)(c.Peer.Name)
}

// state is one loaded policy with its rate limiters.
type state struct {
	policy   *Policy // nil: authentication disabled
	limiters map[string]*limiter
}

type limiter struct {
	ratePerS float64
	lim      *rate.Limiter
}

// charge takes cost requests (a batch call's items, all at once) from the
// bucket, or returns the 429 that refuses them all: the bucket cannot pay
// them now (Retry-After: when it can), or ever (more than its burst, one
// second of the rate: split the batch).
func (l *limiter) charge(now time.Time, name string, cost int) error {
	r := l.lim.ReserveN(now, cost)
	if !r.OK() {
		return &Error{Code: CodeResourceExhausted, RetryAfter: time.Second,
			Message: fmt.Sprintf("a batch of %d items is over principal %q's burst of %d requests (one second of its rate_per_s of %g): every item is charged as a request; split it into batches of at most %d items", cost, name, l.lim.Burst(), l.ratePerS, l.lim.Burst())}
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		what := "requests"
		if cost > 1 {
			what = fmt.Sprintf("requests (this batch call is charged its %d items)", cost)
		}
		return &Error{Code: CodeResourceExhausted, RetryAfter: max(d, time.Millisecond),
			Message: fmt.Sprintf("principal %q is over its rate_per_s of %g %s per second on this process", name, l.ratePerS, what)}
	}
	return nil
}

// root is every caller when there is no auth file.
var root = &Principal{Name: "root", Role: RoleAdmin, Namespaces: []string{"*"}, Internal: true}

// New loads cfg.File (if set) and returns the Authorizer; a file that does
// not parse is an error here (at start) but not on Reload.
func New(cfg Config) (*Authorizer, error) {
	a := &Authorizer{cfg: cfg, logger: cfg.Logger}
	if a.logger == nil {
		a.logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	a.metrics = m
	st := &state{}
	if cfg.File != "" {
		pol, err := loadFile(cfg.File)
		if err != nil {
			return nil, err
		}
		st = newState(pol, nil)
		a.logger.Info("auth file loaded", "file", cfg.File, "principals", len(pol.Principals))
	}
	a.state.Store(st)
	return a, nil
}

func loadFile(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidFile, err)
	}
	pol, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return pol, nil
}

// newState builds the limiters of pol, carrying over from old those whose
// rate did not change, so a reload does not refill every bucket.
func newState(pol *Policy, old *state) *state {
	st := &state{policy: pol, limiters: map[string]*limiter{}}
	for _, p := range pol.Principals {
		if p.RatePerS <= 0 {
			continue
		}
		if old != nil {
			if l := old.limiters[p.Name]; l != nil && l.ratePerS == p.RatePerS {
				st.limiters[p.Name] = l
				continue
			}
		}
		burst := int(math.Max(1, math.Ceil(p.RatePerS))) // one second's worth
		st.limiters[p.Name] = &limiter{ratePerS: p.RatePerS, lim: rate.NewLimiter(rate.Limit(p.RatePerS), burst)}
	}
	return st
}

// Enabled reports whether an auth file is in force.
func (a *Authorizer) Enabled() bool { return a.state.Load().policy != nil }

// Reload re-reads the auth file (call it on SIGHUP). A file that does not
// parse keeps the policy in force; the error (also logged) says why.
// Without Config.File it does nothing.
func (a *Authorizer) Reload() error {
	if a.cfg.File == "" {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	pol, err := loadFile(a.cfg.File)
	if err != nil {
		a.metrics.reload(false)
		a.logger.Error("auth file reload failed; keeping the previous principals", "file", a.cfg.File,
			"error", strings.ReplaceAll(err.Error(), "\n", "; "))
		return err
	}
	a.state.Store(newState(pol, a.state.Load()))
	a.metrics.reload(true)
	a.logger.Info("auth file reloaded", "file", a.cfg.File, "principals", len(pol.Principals))
	return nil
}

// Authenticate maps c to a principal:
//   - without an auth file, root;
//   - a node or router peer: the principal it forwards (which must exist
//     here), or else an internal principal "node:<id>" or "router:<name>"
//     with admin on "*" (the process's own calls);
//   - a client certificate and/or a bearer token, each of which must name a
//     known principal, the same one when both are presented.
func (a *Authorizer) Authenticate(c Credentials) (*Principal, error) {
	p, _, err := a.authenticate(a.state.Load(), c)
	return p, err
}

// authenticate also reports whether the request was forwarded or internal,
// which the rate limit exempts (the process the caller sent it to charged it).
func (a *Authorizer) authenticate(st *state, c Credentials) (*Principal, bool, error) {
	if st.policy == nil {
		if !a.cfg.RequireCertificate {
			return root, false, nil
		}
		switch c.Peer.Kind {
		case pki.KindNode, pki.KindRouter:
			if c.Forwarded == "" {
				return a.peerPrincipal(c), true, nil
			}
			return &Principal{Name: c.Forwarded, Role: RoleAdmin, Namespaces: []string{"*"}}, true, nil
		case pki.KindClient:
			return &Principal{Name: c.Peer.Name, Role: RoleAdmin, Namespaces: []string{"*"}}, false, nil
		}
		return nil, false, unauthenticated("credentials required: this process has no --auth-file, so it accepts only clients presenting a certificate signed by the cluster CA (idemctl cert create-client)")
	}
	if c.Peer.Kind.Peer() {
		if c.Forwarded == "" {
			return a.peerPrincipal(c), true, nil
		}
		p, ok := st.policy.Lookup(c.Forwarded)
		if !ok {
			return nil, false, unauthenticated("%s %q forwarded a request of principal %q, which this process's auth file does not list: keep the auth files of all processes the same", c.Peer.Kind, c.Peer.Name, c.Forwarded)
		}
		return p, true, nil
	}
	var byCert, byToken *Principal
	if c.Peer.Kind == pki.KindClient {
		p, ok := st.policy.Lookup(c.Peer.Name)
		if !ok {
			return nil, false, unauthenticated("the client certificate names principal %q, which the auth file does not list", c.Peer.Name)
		}
		byCert = p
	}
	if c.Authorization != "" {
		scheme, token, _ := strings.Cut(c.Authorization, " ")
		token = strings.TrimSpace(token)
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			return nil, false, unauthenticated("the Authorization header must be \"Bearer TOKEN\"")
		}
		p := matchToken(st.policy, token)
		if p == nil {
			return nil, false, unauthenticated("the bearer token matches no principal of the auth file")
		}
		byToken = p
	}
	switch {
	case byCert != nil && byToken != nil && byCert != byToken:
		return nil, false, unauthenticated("the client certificate names %q but the bearer token %q: present one identity", byCert.Name, byToken.Name)
	case byCert != nil:
		return byCert, false, nil
	case byToken != nil:
		return byToken, false, nil
	}
	return nil, false, unauthenticated("credentials required: present a client certificate signed by the cluster CA, or Authorization: Bearer TOKEN")
}

// matchToken compares the token's SHA-256 with every principal's in
// constant time, never stopping early, so timing reveals neither which
// principal matched nor how much of a hash did.
func matchToken(pol *Policy, token string) *Principal {
	sum := sha256.Sum256([]byte(token))
	var found *Principal
	for _, p := range pol.Principals {
		eq := subtle.ConstantTimeCompare(sum[:], p.tokenHash[:])
		if eq == 1 && p.hasToken && found == nil {
			found = p
		}
	}
	return found
}

// Authorize authenticates c and decides t: nil error and the principal, or
// an *Error with UNAUTHENTICATED, PERMISSION_DENIED or RESOURCE_EXHAUSTED
// (with RetryAfter). The rate limit is charged only for allowed requests.
func (a *Authorizer) Authorize(c Credentials, t Target) (*Principal, error) {
	return a.authorize(c, t, 1)
}

// authorize is Authorize charging cost requests to the principal's rate:
// 0 for a batch call's items (the call paid for all of them), a batch
// call's item count for the call.
func (a *Authorizer) authorize(c Credentials, t Target, cost int) (*Principal, error) {
	st := a.state.Load()
	p, exempt, err := a.authenticate(st, c)
	if err != nil {
		a.metrics.decide(CodeUnauthenticated)
		return nil, err
	}
	if err := check(p, t); err != nil {
		a.metrics.decide(CodePermissionDenied)
		return nil, err
	}
	if l := st.limiters[p.Name]; l != nil && !exempt && cost > 0 {
		if err := l.charge(a.now(), p.Name, cost); err != nil {
			a.metrics.decide(CodeResourceExhausted)
			return nil, err
		}
	}
	a.metrics.decide("OK")
	return p, nil
}

// withWaitCharge returns ctx carrying (backend.WithCharge) the charge of a
// waiting reserve's later proposals: each is one more request of p, charged
// to p's rate on this process, the one that runs the wait (the shard's
// leader, whether the caller reached it directly or through a node or
// router that forwarded it, which charged only the first proposal). An
// internal principal, or one without a rate, is not charged.
func (a *Authorizer) withWaitCharge(ctx context.Context, p *Principal) context.Context {
	if p == nil || p.Internal {
		return ctx
	}
	return backend.WithCharge(ctx, func() error { return a.chargeAgain(p.Name) })
}

// chargeAgain charges one request of the principal name to its rate: nil,
// or a *backend.Error with RESOURCE_EXHAUSTED and the retry hint.
func (a *Authorizer) chargeAgain(name string) error {
	l := a.state.Load().limiters[name]
	if l == nil {
		return nil
	}
	now := a.now()
	r := l.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); !r.OK() || d > 0 {
		r.CancelAt(now)
		a.metrics.decide(CodeResourceExhausted)
		return &backend.Error{Code: contract.CodeResourceExhausted, RetryAfter: max(d, time.Millisecond),
			Message: fmt.Sprintf("principal %q is over its rate_per_s of %g requests per second on this process (a waiting reserve that proposes again is charged as a request)", name, l.ratePerS)}
	}
	a.metrics.decide("OK")
	return nil
}

func check(p *Principal, t Target) error {
	if t.Verb == "" {
		return denied("internal error: no verb for this request (treated as denied)")
	}
	if p.Router {
		if t.Verb == VerbStatus {
			return nil // a router's ring check
		}
		if t.Verb.MinRole() > RoleWriter {
			return denied("%s forwarded no principal, and its own identity (a router's, or a node certificate's for an id outside the committed topology) may route, read and write records (proxy mode) but not %s: that needs the principal of the caller it forwards, with role admin", p.Name, t.Verb)
		}
	}
	if p.Role < t.Verb.MinRole() {
		return denied("principal %q has role %s; %s needs %s", p.Name, p.Role, t.Verb, t.Verb.MinRole())
	}
	if t.Verb.Cluster() {
		if !p.allNamespaces() {
			return denied("principal %q may not %s: a cluster-wide action needs role admin on namespace \"*\"", p.Name, t.Verb)
		}
		return nil
	}
	if t.Verb == VerbAuthenticate {
		return nil
	}
	if !p.AllowsNamespace(t.Namespace) {
		return denied("principal %q may not use namespace %q (its namespaces: %s)", p.Name, t.Namespace, strings.Join(p.Namespaces, ", "))
	}
	return nil
}

func (a *Authorizer) now() time.Time {
	if a.cfg.Now != nil {
		return a.cfg.Now()
	}
	return time.Now()
}

// Stats are the Authorizer's figures for tests and status pages.
type Stats struct {
	Enabled          bool
	Principals       int
	Allowed          uint64
	Unauthenticated  uint64
	PermissionDenied uint64
	RateLimited      uint64
	Reloads          uint64 // successful reloads
	ReloadFailures   uint64 // reloads that kept the old policy
}

// Stats returns the current figures.
func (a *Authorizer) Stats() Stats {
	st := a.state.Load()
	s := a.metrics.stats()
	if st.policy != nil {
		s.Enabled, s.Principals = true, len(st.policy.Principals)
	}
	return s
}

type metrics struct {
	decisions                                 *prometheus.CounterVec
	reloads                                   *prometheus.CounterVec
	ok, unauth, deny, rl, reloadOK, reloadErr atomic.Uint64
}

func newMetrics(reg *prometheus.Registry) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_auth_decisions_total",
			Help: "Authorization decisions by outcome: OK, UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED.",
		}, []string{"outcome"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_auth_reloads_total",
			Help: "Auth file reloads by result: ok, or error (the previous principals stay in force).",
		}, []string{"result"}),
	}
	if reg != nil {
		if err := errors.Join(reg.Register(m.decisions), reg.Register(m.reloads)); err != nil {
			return nil, fmt.Errorf("auth: registering metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) decide(outcome string) {
	m.decisions.WithLabelValues(outcome).Inc()
	switch outcome {
	case "OK":
		m.ok.Add(1)
	case CodeUnauthenticated:
		m.unauth.Add(1)
	case CodePermissionDenied:
		m.deny.Add(1)
	case CodeResourceExhausted:
		m.rl.Add(1)
	}
}

func (m *metrics) reload(ok bool) {
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
		m.reloadOK.Add(1)
		return
	}
	m.reloads.WithLabelValues("error").Inc()
	m.reloadErr.Add(1)
}

func (m *metrics) stats() Stats {
	return Stats{
		Allowed: m.ok.Load(), Unauthenticated: m.unauth.Load(), PermissionDenied: m.deny.Load(),
		RateLimited: m.rl.Load(), Reloads: m.reloadOK.Load(), ReloadFailures: m.reloadErr.Load(),
	}
}

// peerPrincipal is the internal principal of a node or router peer's own
// calls (no forwarded principal). A node of the cluster is admin on "*"
// (its control calls, its own operator steps); a router, or a node
// certificate outside the committed topology, is a writer on "*" that may
// also read the status (Principal.Router): it routes, and its proxy mode
// reads and writes records for callers that are no idem principals, but
// a topology change, an operator action or a policy change needs the
// principal of the caller it forwards.
func (a *Authorizer) peerPrincipal(c Credentials) *Principal {
	id := c.Peer
	if id.Kind == pki.KindRouter || a.outsider(c) {
		return &Principal{Name: id.Kind.String() + ":" + id.Name, Role: RoleWriter, Namespaces: []string{"*"}, Internal: true, Router: true}
	}
	return &Principal{Name: id.Kind.String() + ":" + id.Name, Role: RoleAdmin, Namespaces: []string{"*"}, Internal: true}
}
