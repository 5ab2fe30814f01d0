package httpidem

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/contract"
)

// Header names of the protocol.
const (
	// HeaderKey carries the idempotency key (IETF httpapi draft): a
	// structured-field string ("k") or a bare token.
	HeaderKey = "Idempotency-Key"
	// HeaderFencingToken is set on the request the handler (or upstream)
	// receives: the decimal fencing token of this attempt.
	HeaderFencingToken = "Idempotency-Fencing-Token"
	// HeaderReplayed marks a replayed response.
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a replayed response whose body was larger than
	// the store keeps and was not stored.
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
	// HeaderKeyExpires is set on a stored response, its first answer and
	// every replay: the HTTP-date when the store stops replaying it (the
	// end of its retention).
	HeaderKeyExpires = "Idempotency-Key-Expires"
)

// Defaults of Config; a zero field takes its default.
const (
	DefaultMaxRequestBytes     = 1 << 20
	DefaultSpoolThresholdBytes = 1 << 20
	DefaultMaxStoredBodyBytes  = 1 << 20
	DefaultLease               = 30 * time.Second
	DefaultTimeout             = 60 * time.Second
	DefaultStoreTimeout        = 10 * time.Second
	DefaultRetention           = 24 * time.Hour
	DefaultMaxWait             = contract.MaxWait
	DefaultReleaseStatuses     = "5xx,408,425,429"
	DefaultNamespace           = "default"
)

// DefaultMethods are the methods whose keyed requests the engine handles; all
// others pass through.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// Config configures an Engine. A zero field takes the default named in its
// comment; DefaultConfig spells them out.
type Config struct {
	// Store keeps the reservations and responses. Required.
	Store Store

	// Policy is what the engine does with requests; proxy.Config and
	// client.MiddlewareConfig embed the same struct.
	Policy

	// NamespaceFunc, when set, names the caller of a request: its namespace.
	// An error gives 401; a result that is not a valid namespace 400. It
	// takes precedence over NamespaceHeader and client certificates.
	NamespaceFunc func(r *http.Request) (string, error)
	// Timeout is the deadline of the handler's (upstream's) context, which
	// is detached from the caller's: a caller that goes away does not cancel
	// the work it started. Zero means DefaultTimeout (60s).
	Timeout time.Duration

	// Logger receives lease and store events. Nil discards them.
	Logger *slog.Logger
	// Observe, when set, is called once per request with what became of it.
	Observe func(Event)
}

// Policy is the part of the engine's configuration that every front end
// (the proxy, the Go middleware) exposes as it is: which requests are
// handled, how callers are named, the bounds, the lease and retention, and
// what is stored. A zero field takes the default named in its comment.
type Policy struct {
	// Methods whose requests with an Idempotency-Key are made idempotent;
	// other methods pass through untouched. Nil means DefaultMethods (POST,
	// PATCH).
	Methods []string
	// RequireKey answers a request of Methods without Idempotency-Key with
	// 400 (problem+json) instead of passing it through; nothing runs.
	RequireKey bool

	// NamespaceHeader, when set, is the request header naming the caller
	// (its namespace, so that two callers using the same key never see each
	// other's responses): missing (or repeated) gives 401, not a valid
	// namespace 400. Only trust it behind a gateway that sets it. It takes
	// precedence over client certificates.
	NamespaceHeader string
	// CertNamespace derives the namespace from a verified TLS client
	// certificate (the leaf of the first verified chain) when no namespace
	// header or function is set. Nil means NamespaceFromCert: the common
	// name when it is a valid namespace (and does not start with "spki-"),
	// else "spki-" and 40 hex digits of the SHA-256 of the public key. Only
	// certificates the TLS listener verified count. An error gives 401.
	CertNamespace func(cert *x509.Certificate) (string, error)
	// AuthorizationKey, when set, names a request that has none of the
	// identities above but an Authorization header: its namespace is "auth-"
	// and 40 hex digits of HMAC-SHA256(AuthorizationKey, the header's
	// values), so two callers with different credentials never share a
	// key's response and the namespace reveals nothing about the
	// credential to whoever can read it. Every process that serves the same
	// callers needs the same key (or their replays differ). Nil leaves such
	// requests in DefaultNamespace.
	AuthorizationKey []byte
	// DefaultNamespace is the namespace of a request without another
	// identity. Empty means DefaultNamespace ("default").
	DefaultNamespace string

	// MaxRequestBytes bounds the body of a keyed request; a larger one gets
	// 413. Key-less requests and other methods are not bounded. Zero means
	// DefaultMaxRequestBytes (1 MiB).
	MaxRequestBytes int64
	// SpoolThresholdBytes: a keyed request body is held in memory up to this
	// size and in an unlinked temporary file in SpoolDir beyond it. Zero
	// means DefaultSpoolThresholdBytes (1 MiB), which with the default
	// MaxRequestBytes never spools.
	SpoolThresholdBytes int64
	// SpoolDir is where spooled bodies go; empty means os.TempDir().
	SpoolDir string

	// MaxStoredBodyBytes is the largest response body that is stored; set it
	// to the store's --max-response-bytes. A larger body reaches the first
	// caller in full, streaming, and is stored without its body (replays
	// then carry Idempotent-Body-Omitted: true). Zero means
	// DefaultMaxStoredBodyBytes (1 MiB).
	MaxStoredBodyBytes int64

	// Lease is the reservation's lease, 100ms..10m in whole milliseconds: if
	// the process dies, the key is free again this long (plus the store's
	// clock-skew margin) after the last heartbeat. Zero means DefaultLease
	// (30s).
	Lease time.Duration
	// HeartbeatInterval is how often the lease is renewed while the handler
	// runs; it must be below Lease. Zero means Lease/3.
	HeartbeatInterval time.Duration
	// StoreTimeout bounds each call to the Store (retries included); a
	// reserve that runs out gets 503. Zero means DefaultStoreTimeout (10s).
	StoreTimeout time.Duration
	// Retention is how long a completed response is kept, 1s..30 days in
	// whole seconds (at most the namespace policy's max_retention_s). Zero
	// means the namespace's default: its policy's default_retention_s, else
	// DefaultRetention (24h).
	Retention time.Duration
	// MaxWait bounds how long a request with "Prefer: wait=N" (RFC 7240)
	// that meets a running request with its key waits for that request's
	// response (the store wakes it; nothing polls), 1ms..30s. Zero means
	// DefaultMaxWait (30s); negative ignores Prefer: wait (409 at once, as
	// without it).
	MaxWait time.Duration

	// ReleaseStatuses lists the response statuses that are not final: the
	// response goes to the caller and the key is released, so that a retry
	// runs again. Comma-separated status codes and classes ("5xx"). Empty
	// means DefaultReleaseStatuses ("5xx,408,425,429").
	ReleaseStatuses string

	// FingerprintHeaders are request headers that are part of the request's
	// fingerprint besides method, path, query and body (say Content-Type).
	FingerprintHeaders []string
	// StoredHeaderAllow, when not empty, limits the stored (and replayed)
	// response headers to these names. Hop-by-hop headers, Set-Cookie,
	// Content-Length, the replay markers and the others listed in doc.go
	// are never stored, whatever this says.
	StoredHeaderAllow []string
	// StoredHeaderDeny names further response headers that are not stored.
	StoredHeaderDeny []string
}

// DefaultPolicy returns a Policy with the defaults filled in.
// HeartbeatInterval stays 0 so that it follows a changed Lease (Lease/3).
func DefaultPolicy() Policy {
	return Policy{
		Methods:             slices.Clone(DefaultMethods),
		DefaultNamespace:    DefaultNamespace,
		MaxRequestBytes:     DefaultMaxRequestBytes,
		SpoolThresholdBytes: DefaultSpoolThresholdBytes,
		MaxStoredBodyBytes:  DefaultMaxStoredBodyBytes,
		Lease:               DefaultLease,
		StoreTimeout:        DefaultStoreTimeout,
		MaxWait:             DefaultMaxWait,
		ReleaseStatuses:     DefaultReleaseStatuses,
	}
}

// DefaultConfig returns a Config with the defaults filled in; set Store.
// HeartbeatInterval stays 0 so that it follows a changed Lease (Lease/3).
func DefaultConfig() Config {
	return Config{Policy: DefaultPolicy(), Timeout: DefaultTimeout}
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.Methods == nil {
		c.Methods = slices.Clone(DefaultMethods)
	}
	c.DefaultNamespace = cmp.Or(c.DefaultNamespace, DefaultNamespace)
	c.MaxRequestBytes = cmp.Or(c.MaxRequestBytes, DefaultMaxRequestBytes)
	c.SpoolThresholdBytes = cmp.Or(c.SpoolThresholdBytes, DefaultSpoolThresholdBytes)
	c.MaxStoredBodyBytes = cmp.Or(c.MaxStoredBodyBytes, DefaultMaxStoredBodyBytes)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, c.Lease/3)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, DefaultStoreTimeout)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.ReleaseStatuses = cmp.Or(c.ReleaseStatuses, DefaultReleaseStatuses)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem of c at once; each wraps ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	for _, p := range c.Problems() {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidConfig, p))
	}
	return errors.Join(errs...)
}

// Problems lists what is wrong with c, one sentence per problem naming the
// field; Validate wraps them. Packages that embed the engine's settings in
// their own Config report them under their own error.
func (c Config) Problems() []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if c.Store == nil {
		bad("Store is required")
	}
	d := c.withDefaults()
	if c.Methods != nil && len(c.Methods) == 0 {
		bad("Methods is empty: name at least one method, or leave it nil for POST and PATCH")
	}
	for _, m := range c.Methods {
		if !validToken(m) {
			bad("Methods has %q, which is not an HTTP method token", m)
		}
	}
	if c.NamespaceHeader != "" && !validToken(c.NamespaceHeader) {
		bad("NamespaceHeader %q is not a valid header name", c.NamespaceHeader)
	}
	if !ValidNamespace(d.DefaultNamespace) {
		bad("DefaultNamespace %q is not a valid namespace: use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", c.DefaultNamespace)
	}
	if c.MaxRequestBytes < 0 {
		bad("MaxRequestBytes %d is negative: use a size in bytes, or 0 for %d", c.MaxRequestBytes, DefaultMaxRequestBytes)
	}
	if c.SpoolThresholdBytes < 0 {
		bad("SpoolThresholdBytes %d is negative: use a size in bytes, or 0 for %d", c.SpoolThresholdBytes, DefaultSpoolThresholdBytes)
	}
	if c.MaxStoredBodyBytes < 0 {
		bad("MaxStoredBodyBytes %d is negative: use the store's --max-response-bytes, or 0 for %d", c.MaxStoredBodyBytes, DefaultMaxStoredBodyBytes)
	}
	if d.Lease < contract.MinLease || d.Lease > contract.MaxLease || d.Lease%time.Millisecond != 0 {
		bad("Lease %v is out of range: use %v..%v in whole milliseconds, or 0 for %v", c.Lease, contract.MinLease, contract.MaxLease, DefaultLease)
	}
	if c.HeartbeatInterval < 0 || d.HeartbeatInterval >= d.Lease {
		bad("HeartbeatInterval %v must be positive and below Lease %v (0 means Lease/3)", c.HeartbeatInterval, d.Lease)
	}
	if c.Timeout < 0 {
		bad("Timeout %v is negative: use a duration, or 0 for %v", c.Timeout, DefaultTimeout)
	}
	if c.MaxWait > contract.MaxWait {
		bad("MaxWait %v is above %v, the store's bound: use up to that, 0 for %v, or a negative value to ignore Prefer: wait", c.MaxWait, contract.MaxWait, DefaultMaxWait)
	}
	if c.StoreTimeout < 0 {
		bad("StoreTimeout %v is negative: use a duration, or 0 for %v", c.StoreTimeout, DefaultStoreTimeout)
	}
	if d.Retention != 0 && (d.Retention < contract.MinRetention || d.Retention > contract.MaxRetention || d.Retention%time.Second != 0) {
		bad("Retention %v is out of range: use %v..%v in whole seconds, or 0 for the namespace's default", c.Retention, contract.MinRetention, contract.MaxRetention)
	}
	if _, err := ParseStatusSet(d.ReleaseStatuses); err != nil {
		bad("ReleaseStatuses: %v", err)
	}
	for _, list := range []struct {
		name  string
		names []string
	}{{"FingerprintHeaders", c.FingerprintHeaders}, {"StoredHeaderAllow", c.StoredHeaderAllow}, {"StoredHeaderDeny", c.StoredHeaderDeny}} {
		for _, h := range list.names {
			if !validToken(h) {
				bad("%s has %q, which is not a valid header name", list.name, h)
			}
		}
	}
	return out
}

// StatusSet is a set of HTTP status codes (100..599).
type StatusSet struct{ has [600]bool }

// ParseStatusSet parses a comma-separated list of status codes ("408") and
// classes ("5xx"); spaces around entries are ignored.
func ParseStatusSet(spec string) (StatusSet, error) {
	var s StatusSet
	var errs []error
	for entry := range strings.SplitSeq(spec, ",") {
		entry = strings.TrimSpace(entry)
		switch {
		case entry == "":
			continue
		case len(entry) == 3 && entry[0] >= '1' && entry[0] <= '5' && strings.EqualFold(entry[1:], "xx"):
			base := int(entry[0]-'0') * 100
			for code := base; code < base+100; code++ {
				s.has[code] = true
			}
		default:
			code, err := strconv.Atoi(entry)
			if err != nil || code < 100 || code > 599 {
				errs = append(errs, fmt.Errorf("%q is neither a status code 100..599 nor a class like 5xx", entry))
				continue
			}
			s.has[code] = true
		}
	}
	return s, errors.Join(errs...)
}

// Has reports whether code is in the set.
func (s StatusSet) Has(code int) bool { return code >= 0 && code < len(s.has) && s.has[code] }

// validToken reports whether s is an RFC 9110 token (header names, methods).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
