package server

import (
	"fmt"
	"log/slog"
	"net/http"
	"runtime"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// Server serves the public API over a Backend: the JSON HTTP handler (with
// probes and /metrics) and the gRPC Idempotency service. Both share one
// validator and one set of metrics. It is safe for concurrent use.
type Server struct {
	cfg     Config
	backend backend.Routed
	// policies is cfg.Backend when it stores namespace policies, else nil.
	policyStore backend.Policies
	log         *slog.Logger
	registry    *prometheus.Registry
	metrics     *metrics
	validate    validator
	// tracer starts the API's own spans; nil when Config.TracerProvider
	// is (tracing off: no span code runs).
	tracer trace.Tracer
	// operatorActions counts operator actions (operator.go).
	operatorActions *prometheus.CounterVec
	// inflight bounds the request bytes held at once (inflight.go).
	inflight *inflight

	httpHandler http.Handler
	grpcService *grpcService
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		backend:  backend.AsRouted(cfg.Backend),
		log:      cfg.Logger,
		registry: cfg.Registry,
		validate: validator{maxResponseBytes: cfg.maxResponseBytes()},
		tracer:   tracing.Tracer(cfg.TracerProvider),
	}
	s.policyStore, _ = cfg.Backend.(backend.Policies)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.registry == nil {
		s.registry = prometheus.NewRegistry()
	}
	m, err := newMetrics(s.registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	if s.operatorActions, err = newOperatorMetric(s.registry); err != nil {
		return nil, err
	}
	if s.inflight, err = newInflight(cfg.MaxInflightBytes, s.registry); err != nil {
		return nil, err
	}
	extra, err := extraMux(cfg.ExtraRoutes)
	if err != nil {
		return nil, err
	}
	s.httpHandler = &httpAPI{
		s:       s,
		extra:   extra,
		metrics: promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{ErrorLog: slogPrinter{s.log}}),
	}
	s.grpcService = &grpcService{s: s, workers: newOpWorkers()}
	return s, nil
}

// HTTPHandler serves the JSON API under /v1/, /healthz, /readyz, /metrics and
// Config.ExtraRoutes.
func (s *Server) HTTPHandler() http.Handler { return s.httpHandler }

// GRPCService is the Idempotency service. Register it on a server built with
// GRPCServerOptions (or use NewGRPCServer) for metrics and message sizes.
func (s *Server) GRPCService() idemv1.IdempotencyServer { return s.grpcService }

// GRPCServerOptions are the options a gRPC server serving this API needs:
// with Config.TracerProvider, a stats handler that continues the caller's
// traceparent and starts each RPC's span; a unary interceptor that recovers
// panics and records request metrics (for
// every service on the server, Admin included; idem.v1 has no streaming RPCs), a receive limit that admits a
// max-size response (Config.GRPCMaxMessageBytes), and the contract's limit on
// a request's metadata (contract.MaxRequestHeaderBytes).
func (s *Server) GRPCServerOptions() []grpc.ServerOption {
	return append(s.grpcTraceOptions(),
		grpc.ChainUnaryInterceptor(s.unaryInterceptor, s.inflight.interceptor),
		grpc.MaxRecvMsgSize(s.cfg.GRPCMaxMessageBytes()),
		// A request's metadata is decoded before anyone is authenticated:
		// gRPC-Go's default allows 16 MiB of it per stream, which HPACK lets
		// a client send as a few bytes of repeats.
		grpc.MaxHeaderListSize(contract.MaxRequestHeaderBytes),
		// Streams (each RPC) run on reused goroutines instead of one new
		// goroutine each, which would grow its stack again on every call.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	)
}

// NewGRPCServer returns a gRPC server with GRPCServerOptions, then opts, and
// the Idempotency service registered; register further services (Admin) on
// it before serving.
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	g := grpc.NewServer(append(s.GRPCServerOptions(), opts...)...)
	idemv1.RegisterIdempotencyServer(g, s.grpcService)
	return g
}

// NewHTTPHandler is New(cfg).HTTPHandler().
func NewHTTPHandler(cfg Config) (http.Handler, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return s.HTTPHandler(), nil
}

// NewGRPCService is New(cfg).GRPCService(). The service recovers its own
// panics; for metrics, build the gRPC server with New(cfg).GRPCServerOptions.
func NewGRPCService(cfg Config) (idemv1.IdempotencyServer, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return s.GRPCService(), nil
}

// extraMux builds the mux of Config.ExtraRoutes; a pattern ServeMux rejects
// (malformed, conflicting) becomes an error instead of a panic.
func extraMux(routes map[string]http.Handler) (mux *http.ServeMux, err error) {
	if len(routes) == 0 {
		return nil, nil
	}
	defer func() {
		if p := recover(); p != nil {
			mux, err = nil, fmt.Errorf("%w: ExtraRoutes: %v", ErrInvalidConfig, p)
		}
	}()
	mux = http.NewServeMux()
	for pattern, h := range routes {
		mux.Handle(pattern, h)
	}
	return mux, nil
}

// slogPrinter adapts a *slog.Logger to promhttp's Println logger.
type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Error("metrics endpoint", "error", fmt.Sprint(v...)) }
