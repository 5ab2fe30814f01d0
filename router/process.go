package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/console"
	"github.com/idem-dev/idem/forward"
	"github.com/idem-dev/idem/internal/serving"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/proxy"
	"github.com/idem-dev/idem/security/transport"
	"github.com/idem-dev/idem/server"
)

// ErrInvalidProcessConfig: ProcessConfig.Validate failed; the joined errors
// say why.
var ErrInvalidProcessConfig = errors.New("router: invalid process config")

// DefaultRingCheckTimeout is how long a starting router waits for a node
// to say which ring the cluster was created with before it serves anyway
// (the check goes on in the background).
const DefaultRingCheckTimeout = 3 * time.Second

// ProcessConfig configures the idemrouter process: the Backend, the JSON
// and gRPC API over it, and optionally the proxy.
type ProcessConfig struct {
	// Backend configures the forwarding Backend; its Logger and Registry
	// default to the process's.
	Backend BackendConfig
	// HTTPAddr and GRPCAddr are where the JSON API (with probes and
	// metrics) and the gRPC API listen, HOST:PORT. Required.
	HTTPAddr, GRPCAddr string
	// MaxResponseBytes is the largest stored response body the API accepts
	// (decoded bytes); 0 means server.DefaultMaxResponseBytes. Set it as on
	// the nodes.
	MaxResponseBytes int64
	// RingCheckTimeout bounds the wait, at start, for a node to confirm the
	// ring; 0 means DefaultRingCheckTimeout.
	RingCheckTimeout time.Duration
	// Proxy, when set, turns on proxy mode: a proxy over the same Backend,
	// served on ProxyAddr and drained with the API. Its Store is set to the
	// Backend; a nil Logger or Registry takes the process's.
	Proxy     *proxy.Config
	ProxyAddr string
	// Version is reported by the API and the start-up line.
	Version string
	// Logger; nil discards.
	Logger *slog.Logger
	// Registry receives every metric and is what /metrics serves; nil
	// creates a private one.
	Registry *prometheus.Registry
	// Security is the trust boundary (certificates, auth file, listener
	// limits) of the listeners and of the dials to nodes (added to
	// Backend.DialOptions, or to forward.DefaultDialOptions when those are nil);
	// nil means transport.Insecure(): plaintext, every caller root.
	Security *transport.Kit
	// TracerProvider, when set, traces every call: the API's and proxy
	// mode's spans continue the caller's W3C traceparent, and it travels on
	// to the nodes (Backend.TracerProvider takes it unless set) and, in
	// proxy mode, to the upstream. Nil: tracing off.
	TracerProvider trace.TracerProvider
	// TraceKeys puts keys in clear on spans (--trace-keys).
	TraceKeys bool
}

// Validate reports every problem of c at once.
func (c ProcessConfig) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidProcessConfig}, args...)...))
	}
	if err := c.Backend.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.HTTPAddr == "" || c.GRPCAddr == "" {
		bad("an HTTP and a gRPC listen address are required")
	}
	if c.Proxy != nil && c.ProxyAddr == "" {
		bad("proxy mode needs a proxy listen address")
	}
	if c.Proxy != nil {
		// Everything but the Store, which Start fills in with the
		// process's own Backend: a bad proxy setting fails here, before
		// anything listens.
		pc := *c.Proxy
		pc.Store = proxy.BackendStore(nil)
		if err := pc.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MaxResponseBytes < 0 || c.RingCheckTimeout < 0 {
		bad("max response bytes and ring check timeout must not be negative")
	}
	return errors.Join(errs...)
}

// ListenError says which of the process's listeners could not be bound:
// "http", "grpc" or "proxy".
type ListenError struct {
	Listener string
	Err      error
}

func (e *ListenError) Error() string {
	return "router: " + e.Listener + " listener: " + e.Err.Error()
}

func (e *ListenError) Unwrap() error { return e.Err }

// Process is one idemrouter: a Backend forwarding to the cluster's nodes,
// the API over it, and proxy mode when configured.
type Process struct {
	cfg     ProcessConfig
	log     *slog.Logger
	backend *Backend
	servers []serving.Server
	addrs   map[string]string // listener -> bound address
	started atomic.Bool
	console *console.Console // the operator console at /ui/
}

// NewProcess validates cfg. It opens nothing and starts no goroutine: Start
// does.
func NewProcess(cfg ProcessConfig) (*Process, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Backend.Logger == nil {
		cfg.Backend.Logger = cfg.Logger
	}
	if cfg.Backend.Registry == nil {
		cfg.Backend.Registry = cfg.Registry
	}
	if cfg.RingCheckTimeout == 0 {
		cfg.RingCheckTimeout = DefaultRingCheckTimeout
	}
	if cfg.Security == nil {
		cfg.Security = transport.Insecure()
	}
	if cfg.Backend.DialOptions == nil {
		cfg.Backend.DialOptions = forward.DefaultDialOptions()
	}
	cfg.Backend.DialOptions = append(slices.Clip(cfg.Backend.DialOptions), cfg.Security.DialOptions()...)
	if cfg.Backend.TracerProvider == nil {
		cfg.Backend.TracerProvider = cfg.TracerProvider
	}
	return &Process{cfg: cfg, log: cfg.Logger, addrs: map[string]string{}}, nil
}

// Start builds the Backend, refuses to go on against a cluster created with
// another ring, and binds the listeners. When no node answers the ring
// check within RingCheckTimeout (the cluster is starting too), the check
// goes on in the background and the router stays unready on a mismatch. On
// error everything Start opened is closed again.
func (p *Process) Start(ctx context.Context) (err error) {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("router: process already started")
	}
	cfg := p.cfg
	if p.backend, err = NewBackend(cfg.Backend); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			serving.Close(p.servers)
			p.backend.Close()
		}
	}()
	// Routing by the wrong ring would send keys to shards that do not
	// hold them.
	checkCtx, cancel := context.WithTimeout(ctx, cfg.RingCheckTimeout)
	err = p.backend.RingError(checkCtx)
	cancel()
	if err != nil {
		return err
	}
	// The console reads through the API as the listener serves it
	// (authentication in front), which exists once the API does.
	var httpHandler http.Handler
	ccfg := console.DefaultConfig()
	ccfg.API = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { httpHandler.ServeHTTP(w, r) })
	ccfg.Logger, ccfg.Process = p.log, "idemrouter"
	if cfg.Registry != nil {
		ccfg.Registry = cfg.Registry
	}
	if p.console, err = console.New(ccfg); err != nil {
		return err
	}
	api, err := server.New(server.Config{Backend: p.backend, Logger: p.log, Registry: cfg.Registry, Version: cfg.Version, MaxResponseBytes: cfg.MaxResponseBytes,
		ExtraRoutes:    map[string]http.Handler{"/ui/": p.console.Handler()},
		TracerProvider: cfg.TracerProvider, TraceKeys: cfg.TraceKeys})
	if err != nil {
		return err
	}
	httpHandler = console.Sessions(cfg.Security.HTTPHandler(api.HTTPHandler()))
	httpLn, err := p.listen("http", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	p.servers = append(p.servers, serving.HTTPWithTimeouts("http", httpLn, httpHandler, p.log, cfg.Security.HTTPTimeouts()))
	grpcLn, err := p.listen("grpc", cfg.GRPCAddr)
	if err != nil {
		return err
	}
	grpcSrv := api.NewGRPCServer(cfg.Security.GRPCServerOptions()...)
	idemv1.RegisterAdminServer(grpcSrv, api.KeysAdmin())
	p.servers = append(p.servers, serving.GRPC("grpc", grpcLn, grpcSrv))

	if cfg.Proxy != nil {
		pcfg := *cfg.Proxy
		pcfg.Store = proxy.BackendStore(p.backend)
		if pcfg.Logger == nil {
			pcfg.Logger = p.log.With("component", "proxy")
		}
		if pcfg.Registry == nil {
			pcfg.Registry = cfg.Registry
		}
		if cfg.TracerProvider != nil && pcfg.Transport == nil {
			// The upstream request continues the caller's trace.
			pcfg.Transport = otelhttp.NewTransport(http.DefaultTransport.(*http.Transport).Clone(),
				otelhttp.WithTracerProvider(cfg.TracerProvider), otelhttp.WithPropagators(tracing.Propagator))
		}
		px, err := proxy.New(pcfg)
		if err != nil {
			return err
		}
		var proxyHandler http.Handler = px
		if cfg.TracerProvider != nil {
			// The caller's URL path is its own service's, never an
			// idempotency key (that travels in a header, not recorded).
			proxyHandler = otelhttp.NewHandler(px, "idem.proxy",
				otelhttp.WithTracerProvider(cfg.TracerProvider), otelhttp.WithPropagators(tracing.Propagator),
				otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "idem.proxy " + r.Method }))
		}
		proxyLn, err := p.listen("proxy", cfg.ProxyAddr)
		if err != nil {
			return err
		}
		// A keyed request may run upstream for UpstreamTimeout before the
		// proxy answers: the write timeout allows for it.
		pt := cfg.Security.HTTPTimeouts()
		pt.WriteTimeout = cmp.Or(pt.WriteTimeout, serving.DefaultWriteTimeout) + cmp.Or(pcfg.UpstreamTimeout, proxy.DefaultUpstreamTimeout)
		p.servers = append(p.servers, serving.HTTPWithTimeouts("proxy", proxyLn, proxyHandler, p.log, pt))
		p.log.Info("proxy mode", "proxy", p.addrs["proxy"], "upstream", pcfg.Upstream, "require_key", pcfg.RequireKey,
			"namespace_header", pcfg.NamespaceHeader, "max_wait", pcfg.MaxWait)
	}
	return nil
}

func (p *Process) listen(name, addr string) (net.Listener, error) {
	listen := p.cfg.Security.ListenHTTP // the proxy's callers are not idem principals
	switch name {
	case "grpc":
		listen = p.cfg.Security.ListenGRPC
	case "http":
		listen = p.cfg.Security.ListenAPI
	}
	ln, err := listen(addr)
	if err != nil {
		return nil, &ListenError{Listener: name, Err: err}
	}
	p.addrs[name] = ln.Addr().String()
	return ln, nil
}

// HTTPAddr, GRPCAddr and ProxyAddr are the bound listener addresses (after
// Start; ProxyAddr is "" without proxy mode).
func (p *Process) HTTPAddr() string  { return p.addrs["http"] }
func (p *Process) GRPCAddr() string  { return p.addrs["grpc"] }
func (p *Process) ProxyAddr() string { return p.addrs["proxy"] }

// Backend returns the process's Backend (after Start).
func (p *Process) Backend() *Backend { return p.backend }

// Run starts the process and serves until ctx ends, then drains (see Serve).
func (p *Process) Run(ctx context.Context) error {
	if err := p.Start(ctx); err != nil {
		return err
	}
	return p.Serve(ctx)
}

// Serve answers until ctx ends or a listener fails, then stops taking
// requests and lets in-flight ones finish (each is bounded by the request
// timeout) within serving.DrainTimeout, and closes the Backend. A clean
// drain returns nil.
func (p *Process) Serve(ctx context.Context) error {
	if p.servers == nil {
		return errors.New("router: process not started (call Start, or Run)")
	}
	defer p.backend.Close()
	defer p.console.Close()
	t := p.cfg.Backend.Topology
	p.log.Info("idemrouter serving", "cluster", t.Cluster, "http", p.HTTPAddr(),
		"grpc", p.GRPCAddr(), "tls", p.cfg.Security.Secure(), "auth_file", p.cfg.Security.Authorizer().Enabled(), "nodes", len(t.Nodes()), "request_timeout", p.cfg.Backend.RequestTimeout, "version", p.cfg.Version)
	serveErr := serving.Serve(ctx, p.log, p.servers)
	p.log.Info("draining")
	drainCtx, cancel := context.WithTimeout(context.Background(), serving.DrainTimeout)
	defer cancel()
	drainErr := serving.Drain(drainCtx, p.servers)
	p.log.Info("stopped")
	return errors.Join(serveErr, drainErr)
}
