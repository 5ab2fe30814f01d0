package proxy

import (
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/idem-dev/idem/internal/httpidem"
	"github.com/prometheus/client_golang/prometheus"
)

// Errors of package proxy.
var (
	// ErrInvalidConfig: a Config failed Validate; the joined errors name
	// every problem.
	ErrInvalidConfig = errors.New("proxy: invalid config")
)

// Defaults of Config. A zero field takes its default, except XForwarded
// (DefaultConfig turns it on).
const (
	DefaultMaxRequestBytes     = httpidem.DefaultMaxRequestBytes     // --max-request-bytes: 1 MiB
	DefaultMaxStoredBodyBytes  = httpidem.DefaultMaxStoredBodyBytes  // the store's --max-response-bytes: 1 MiB
	DefaultSpoolThresholdBytes = httpidem.DefaultSpoolThresholdBytes // 1 MiB
	DefaultLease               = httpidem.DefaultLease               // 30s
	DefaultUpstreamTimeout     = httpidem.DefaultTimeout             // 60s
	DefaultStoreTimeout        = httpidem.DefaultStoreTimeout        // 10s
	DefaultRetention           = httpidem.DefaultRetention           // 24h
	DefaultReleaseStatuses     = httpidem.DefaultReleaseStatuses     // "5xx,408,425,429"
)

// Config configures a Proxy. The first four fields are the idemrouter flags
// of proxy mode; the rest have defaults that suit most deployments.
type Config struct {
	// Upstream is where requests go (--upstream): an absolute http or https
	// URL. Its path, if any, prefixes every request path ("/api" + "/pay" =
	// "/api/pay"), its query is merged with the request's. Required.
	Upstream string
	// RequireKey (--require-key) answers a POST or PATCH without
	// Idempotency-Key with 400; nothing reaches the upstream.
	RequireKey bool
	// NamespaceHeader (--namespace-header), when set, is the request header
	// naming the caller (its namespace): a keyed POST or PATCH without it
	// gets 401, one whose value is not a valid namespace 400. Without it the
	// namespace comes from a verified TLS client certificate (see
	// CertNamespace), else it is "default".
	NamespaceHeader string
	// MaxRequestBytes (--max-request-bytes) bounds the body of a keyed
	// request; a larger one gets 413. Key-less requests and other methods
	// are not bounded. Zero means DefaultMaxRequestBytes (1 MiB).
	MaxRequestBytes int64

	// Store keeps reservations and responses. Required. Inside idemrouter:
	// BackendStore(the router's backend.Backend).
	Store Store
	// Logger receives upstream failures and lease events. Nil discards.
	Logger *slog.Logger
	// Registry receives the idem_proxy_* metrics; pass the process-wide
	// registry that /metrics serves. Nil: a private registry.
	Registry *prometheus.Registry

	// Lease is the reservation's lease while the upstream works, 100ms..10m
	// in whole milliseconds: if the proxy dies, the key is free again this
	// long (plus the store's clock-skew margin) after the last heartbeat.
	// Zero means DefaultLease (30s).
	Lease time.Duration
	// HeartbeatInterval is how often the lease is renewed while the upstream
	// works; below Lease. Zero means Lease/3.
	HeartbeatInterval time.Duration
	// UpstreamTimeout is the ceiling of one keyed upstream request, response
	// body included; past it the caller gets 504 and the key is released.
	// Key-less requests have no ceiling but the caller's. Zero means
	// DefaultUpstreamTimeout (60s).
	UpstreamTimeout time.Duration
	// StoreTimeout bounds each store call (retries included); a reserve
	// that runs out gets 503. Set it near the router's --request-timeout.
	// Zero means DefaultStoreTimeout (10s).
	StoreTimeout time.Duration
	// Retention is how long a completed response is kept, 1s..30 days in
	// whole seconds. Zero means DefaultRetention (24h).
	Retention time.Duration
	// ReleaseStatuses are the upstream statuses that are not final: the
	// answer goes to the caller and the key is released, so a retry runs
	// again. Comma-separated codes and classes. Empty means
	// DefaultReleaseStatuses ("5xx,408,425,429"). The proxy's own 502 and
	// 504 always release.
	ReleaseStatuses string
	// FingerprintHeaders are request headers that count in the request's
	// fingerprint besides method, path, query and body (say Content-Type).
	// Default: none.
	FingerprintHeaders []string
	// StoredHeaderAllow, when not empty, limits the stored and replayed
	// response headers to these names. Hop-by-hop headers, Set-Cookie,
	// Content-Length and the replay markers are never stored.
	StoredHeaderAllow []string
	// StoredHeaderDeny names further response headers not to store.
	StoredHeaderDeny []string
	// MaxStoredBodyBytes is the largest upstream response body stored; set
	// it to the store's --max-response-bytes. A larger body reaches the
	// first caller in full, streaming, and is stored without its body
	// (replays carry Idempotent-Body-Omitted: true). Zero means
	// DefaultMaxStoredBodyBytes (1 MiB).
	MaxStoredBodyBytes int64
	// SpoolThresholdBytes: a keyed request body is buffered in memory up to
	// this size and in an unlinked temporary file beyond it (in SpoolDir,
	// empty meaning os.TempDir()). Zero means DefaultSpoolThresholdBytes
	// (1 MiB), which with the default MaxRequestBytes never spools.
	SpoolThresholdBytes int64
	SpoolDir            string
	// Methods whose keyed requests are made idempotent. Nil means POST and
	// PATCH, as the contract says.
	Methods []string
	// CertNamespace derives the namespace from a verified TLS client
	// certificate when NamespaceHeader is not set. Nil means
	// httpidem.NamespaceFromCert: the certificate's common name when it is a
	// valid namespace (and does not start with "spki-"), else "spki-" and
	// 40 hex digits of the SHA-256 of its public key. Only certificates the
	// proxy's TLS listener verified count (tls.RequireAndVerifyClientCert or
	// VerifyClientCertIfGiven).
	CertNamespace func(cert *x509.Certificate) (string, error)

	// Transport sends the upstream requests. Nil means a clone of
	// http.DefaultTransport.
	Transport http.RoundTripper
	// PreserveHost sends the caller's Host header upstream instead of the
	// upstream URL's host.
	PreserveHost bool
	// XForwarded sets X-Forwarded-For, X-Forwarded-Host and
	// X-Forwarded-Proto on upstream requests, replacing what the caller sent
	// (and dropping its Forwarded): the proxy is the edge, and callers'
	// claims are not passed on as facts. Off, the caller's forwarding
	// headers pass untouched. DefaultConfig turns it on.
	XForwarded bool
}

// DefaultConfig returns a Config with the defaults filled in; set Upstream
// and Store (and Logger, Registry) before use. HeartbeatInterval stays 0 so
// that it follows a changed Lease (Lease/3).
func DefaultConfig() Config {
	return Config{
		MaxRequestBytes:     DefaultMaxRequestBytes,
		Lease:               DefaultLease,
		UpstreamTimeout:     DefaultUpstreamTimeout,
		StoreTimeout:        DefaultStoreTimeout,
		Retention:           DefaultRetention,
		ReleaseStatuses:     DefaultReleaseStatuses,
		MaxStoredBodyBytes:  DefaultMaxStoredBodyBytes,
		SpoolThresholdBytes: DefaultSpoolThresholdBytes,
		Methods:             slices.Clone(httpidem.DefaultMethods),
		XForwarded:          true,
	}
}

// Validate reports every problem of c at once; each wraps ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if _, err := c.upstreamURL(); err != nil {
		bad("%v", err)
	}
	if c.UpstreamTimeout < 0 {
		bad("UpstreamTimeout %v is negative: use a duration, or 0 for %v", c.UpstreamTimeout, DefaultUpstreamTimeout)
	}
	for _, p := range c.engineConfig().Problems() {
		bad("%s", p)
	}
	return errors.Join(errs...)
}

func (c Config) upstreamURL() (*url.URL, error) {
	if c.Upstream == "" {
		return nil, errors.New("Upstream is required: the URL requests are forwarded to (--upstream), like http://127.0.0.1:9000")
	}
	u, err := url.Parse(c.Upstream)
	if err != nil {
		return nil, fmt.Errorf("Upstream %q is not a URL: %v", c.Upstream, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("Upstream %q must be an absolute http:// or https:// URL with a host", c.Upstream)
	}
	if u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("Upstream %q must not carry a fragment or user info", c.Upstream)
	}
	return u, nil
}

// engineConfig maps c onto the shared engine's Config (without Logger and
// Observe, which New adds).
func (c Config) engineConfig() httpidem.Config {
	timeout := c.UpstreamTimeout
	if timeout < 0 {
		timeout = 0 // reported by Validate under its own name
	}
	return httpidem.Config{
		Store:               c.Store,
		Methods:             c.Methods,
		RequireKey:          c.RequireKey,
		NamespaceHeader:     c.NamespaceHeader,
		CertNamespace:       c.CertNamespace,
		MaxRequestBytes:     c.MaxRequestBytes,
		SpoolThresholdBytes: c.SpoolThresholdBytes,
		SpoolDir:            c.SpoolDir,
		MaxStoredBodyBytes:  c.MaxStoredBodyBytes,
		Lease:               c.Lease,
		HeartbeatInterval:   c.HeartbeatInterval,
		Timeout:             timeout,
		StoreTimeout:        c.StoreTimeout,
		Retention:           c.Retention,
		ReleaseStatuses:     c.ReleaseStatuses,
		FingerprintHeaders:  c.FingerprintHeaders,
		StoredHeaderAllow:   c.StoredHeaderAllow,
		StoredHeaderDeny:    c.StoredHeaderDeny,
		Logger:              c.Logger,
	}
}
