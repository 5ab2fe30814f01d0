package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/idem-dev/idem/httpidem"
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
	DefaultMaxWait             = httpidem.DefaultMaxWait             // 30s: --max-wait
	DefaultReleaseStatuses     = httpidem.DefaultReleaseStatuses     // "5xx,408,425,429"
)

// Policy is the engine's policy that Config embeds: which requests are
// made idempotent, how callers are named, the bounds, the lease and
// retention, and what is stored (the same struct as
// client.MiddlewareConfig's, so that the proxy and the Go middleware cannot
// drift). Its fields are set on a Config directly (cfg.RequireKey = true).
type Policy = httpidem.Policy

// Config configures a Proxy. Upstream, Store and the flags of proxy mode
// (Policy.RequireKey is --require-key, NamespaceHeader --namespace-header,
// MaxRequestBytes --max-request-bytes, MaxStoredBodyBytes the store's
// --max-response-bytes) are what most deployments set; the rest have
// defaults that suit them.
type Config struct {
	// Upstream is where requests go (--upstream): an absolute http or https
	// URL. Its path, if any, prefixes every request path ("/api" + "/pay" =
	// "/api/pay"), its query is merged with the request's. Required.
	Upstream string

	// Store keeps reservations and responses. Required. Inside idemrouter:
	// BackendStore(the router's backend.Backend).
	Store Store
	// Logger receives upstream failures and lease events. Nil discards.
	Logger *slog.Logger
	// Registry receives the idem_proxy_* metrics; pass the process-wide
	// registry that /metrics serves. Nil: a private registry.
	Registry *prometheus.Registry

	// Policy: see the type. The proxy's own 502 and 504 always release the
	// key, whatever ReleaseStatuses says.
	Policy

	// UpstreamTimeout is the ceiling of one keyed upstream request, response
	// body included; past it the caller gets 504 and the key is released.
	// Key-less requests have no ceiling but the caller's. Zero means
	// DefaultUpstreamTimeout (60s).
	UpstreamTimeout time.Duration

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
		Policy:          httpidem.DefaultPolicy(),
		UpstreamTimeout: DefaultUpstreamTimeout,
		XForwarded:      true,
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
	return httpidem.Config{Store: c.Store, Policy: c.Policy, Timeout: timeout, Logger: c.Logger}
}
