package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Backend executes validated commands (see package backend, which defines
// it and the errors it may return).
type Backend = backend.Backend

// Defaults and bounds of Config.
const (
	// DefaultMaxResponseBytes is the default largest stored response body.
	DefaultMaxResponseBytes = contract.DefaultMaxResponseBytes
	// MaxMaxResponseBytes bounds MaxResponseBytes: a stored response travels
	// in one Raft entry and one gRPC message.
	MaxMaxResponseBytes = contract.MaxMaxResponseBytes
	// DefaultReadyTimeout bounds one Backend.Ready call of /readyz.
	DefaultReadyTimeout = 2 * time.Second
)

// Config configures the HTTP handler and the gRPC service.
type Config struct {
	// Backend executes the validated commands. Required.
	Backend Backend
	// Logger receives backend failures and recovered panics. Nil discards.
	Logger *slog.Logger
	// Registry receives the request metrics (idem_api_*) and is what
	// /metrics serves, so pass the process-wide registry. Nil: a private
	// registry that /metrics serves alone.
	Registry *prometheus.Registry
	// MaxResponseBytes is the largest stored response body, in decoded bytes
	// (--max-response-bytes); a complete with a larger body gets 413
	// PAYLOAD_TOO_LARGE. 0 means DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// MaxRequestBytes bounds a JSON request body in bytes; a larger one gets
	// 413 PAYLOAD_TOO_LARGE. 0 derives it from MaxResponseBytes (see
	// MaxRequestBytesFor), which leaves room for a max-size body in base64
	// with JSON escapes plus max-size headers. A set value must be at least
	// that derived value.
	MaxRequestBytes int64
	// MaxInflightBytes bounds the request bytes this server holds at once
	// (JSON bodies, unary gRPC messages) in requests not yet answered: past
	// it, while others are in flight, a request gets 503 UNAVAILABLE with
	// Retry-After (inflight.go). 0 means no bound.
	MaxInflightBytes int64
	// Version is this build's version, reported by /healthz.
	Version string
	// UnsafeSettings names the settings in force that turn a safety check
	// off (--insecure, the clock check off, fault injection); /readyz's body
	// lists them ("unsafe_settings") so that a probe or a person sees them.
	UnsafeSettings []string
	// ReadyTimeout bounds the Backend.Ready call of one /readyz request.
	// 0 means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// ExtraRoutes are further HTTP handlers served by the same handler, keyed
	// by http.ServeMux pattern ("GET /status"). They never shadow the API
	// (/v1/...), /healthz, /readyz or /metrics, which are matched first.
	ExtraRoutes map[string]http.Handler
	// Routing answers the Routing RPC of the Idempotency service (a node's
	// ring, node addresses and known leaders, for clients that place keys
	// themselves). Nil answers UNIMPLEMENTED, as a router does: its clients
	// keep sending calls round-robin.
	Routing func(context.Context) (*idemv1.RoutingResponse, error)
	// LeaderAddr returns the JSON API address (HOST:PORT) of node nodeID,
	// "" when unknown. With it, every answer of the JSON API for one key
	// (reserve, heartbeat, complete, release, checkpoint, get; errors
	// included) carries the LeaderHeader with the JSON address of the node
	// the backend named as the key's shard's leader, so that a JSON client
	// sends the key's next calls there and skips the forwarding hop. Nil
	// (a router, whose JSON callers need no hint): no header.
	LeaderAddr func(nodeID string) string
	// TracerProvider, when set, traces the API: a call's span continues
	// the caller's W3C traceparent (gRPC metadata or HTTP header) and
	// carries the namespace, operation and outcome. Nil: tracing off, at no
	// cost per request.
	TracerProvider trace.TracerProvider
	// TraceKeys puts the key in clear on the API's spans (--trace-keys);
	// off, spans never carry it.
	TraceKeys bool
	// Topology serves /v1/topology (a node's: the cluster's topology and
	// online changes of it). Nil answers 404, as a process without one.
	Topology http.Handler
}

// DefaultConfig returns a Config with the defaults filled in; set Backend
// (and Logger, Registry) before use. MaxRequestBytes stays 0, so that it
// follows a changed MaxResponseBytes.
func DefaultConfig() Config {
	return Config{
		MaxResponseBytes: DefaultMaxResponseBytes,
		ReadyTimeout:     DefaultReadyTimeout,
	}
}

// MaxRequestBytesFor is the JSON request body bound derived from
// maxResponseBytes: the body in base64 (4/3), doubled for encoders that
// escape '/' as "\/", plus 512 KiB for the headers (64 KiB, up to 6x when
// JSON-escaped) and the other fields.
func MaxRequestBytesFor(maxResponseBytes int64) int64 {
	base64Len := (maxResponseBytes + 2) / 3 * 4
	return 2*base64Len + 512<<10
}

// GRPCMaxMessageBytes is the largest gRPC message the service accepts, and
// what a gRPC client of it (the router) should allow for requests and
// replies: a max-size response body plus headers and other fields, and never
// below gRPC's default of 4 MiB.
func (c Config) GRPCMaxMessageBytes() int {
	return contract.GRPCMaxMessageBytes(c.maxResponseBytes())
}

func (c Config) maxResponseBytes() int64 {
	return cmp.Or(c.MaxResponseBytes, DefaultMaxResponseBytes)
}

func (c Config) maxRequestBytes() int64 {
	if c.MaxRequestBytes == 0 {
		return MaxRequestBytesFor(c.maxResponseBytes())
	}
	return c.MaxRequestBytes
}

func (c Config) readyTimeout() time.Duration {
	return cmp.Or(c.ReadyTimeout, DefaultReadyTimeout)
}

// Validate reports every problem of c at once; each wraps ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Backend == nil {
		bad("Backend is required")
	}
	if c.MaxResponseBytes < 0 || c.MaxResponseBytes > MaxMaxResponseBytes {
		bad("MaxResponseBytes %d is out of range: use 1..%d, or 0 for the default %d",
			c.MaxResponseBytes, MaxMaxResponseBytes, DefaultMaxResponseBytes)
	} else if c.MaxRequestBytes != 0 && c.MaxRequestBytes < MaxRequestBytesFor(c.maxResponseBytes()) {
		bad("MaxRequestBytes %d cannot carry a complete with a %d-byte response body: use at least %d, or 0 to derive it",
			c.MaxRequestBytes, c.maxResponseBytes(), MaxRequestBytesFor(c.maxResponseBytes()))
	}
	if c.MaxInflightBytes < 0 {
		bad("MaxInflightBytes %d is negative: use a positive number of bytes, or 0 for no bound", c.MaxInflightBytes)
	}
	if c.ReadyTimeout < 0 {
		bad("ReadyTimeout %v is negative: use a positive duration, or 0 for the default %v", c.ReadyTimeout, DefaultReadyTimeout)
	}
	for pattern, h := range c.ExtraRoutes {
		if h == nil {
			bad("ExtraRoutes[%q] has a nil handler", pattern)
		}
	}
	return errors.Join(errs...)
}
