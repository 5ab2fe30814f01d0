package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
)

// Defaults used by DefaultConfig and for zero-valued Config fields.
const (
	DefaultMaxAttempts    = 5
	DefaultBaseBackoff    = 50 * time.Millisecond
	DefaultMaxBackoff     = 2 * time.Second
	DefaultRequestTimeout = 10 * time.Second
	DefaultRoutingRefresh = 5 * time.Second
)

// Config configures a Client.
type Config struct {
	// Endpoints are the gRPC addresses (host:port) of idem nodes or routers.
	// Calls are spread over them round-robin (unless routing sends them to
	// their shard's leader, see DisableRouting), and an attempt that failed
	// is retried on the next one. At least one is required.
	Endpoints []string

	// DialOptions are passed to grpc.NewClient for every endpoint. When it
	// holds no transport-credentials option the client dials in plaintext
	// (insecure credentials), which suits loopback and private networks only.
	DialOptions []grpc.DialOption

	// TLS, when set, secures every connection (a secure cluster: trust its
	// ca.crt, present a client certificate for certificate authentication;
	// pki.ClientTLS builds one from a certs dir). Nil means plaintext unless
	// DialOptions carry credentials.
	TLS *tls.Config

	// Token, when set, is sent with every call as "authorization: Bearer
	// TOKEN"; it needs TLS (a token never crosses a plaintext link).
	Token string

	// MaxAttempts is how many times one call is tried in all, the first try
	// included (1 disables retries). Zero means DefaultMaxAttempts.
	MaxAttempts int

	// BaseBackoff is the wait before the first retry; each further retry
	// doubles it, up to MaxBackoff, and every wait is jittered (between half
	// and all of the computed value). Zero means DefaultBaseBackoff.
	BaseBackoff time.Duration

	// MaxBackoff caps the wait between two attempts. Zero means
	// DefaultMaxBackoff.
	MaxBackoff time.Duration

	// RequestTimeout bounds one attempt; the caller's context deadline bounds
	// the whole call, retries included. Zero means DefaultRequestTimeout. It
	// should exceed the routers' --request-timeout (5 s by default), so that a
	// slow shard answers UNAVAILABLE (and is retried) before the client gives
	// up on the attempt. An attempt that carries a payload (a completion's
	// response, a checkpoint, a batch) gets a second more per MiB it
	// carries, and a waiting reserve its wait, as the nodes and routers give
	// them.
	RequestTimeout time.Duration

	// Logger receives retry and lease events at debug and warn level. Nil
	// discards them.
	Logger *slog.Logger

	// DisableRouting turns leader routing off. With routing on (the
	// default) the client asks an endpoint in the background for the
	// nodes' ring and addresses (the Routing RPC), places each key itself
	// and sends each call to the leader of its shard, dialling that node at
	// the gRPC address the topology file gives it, with the same TLS, token
	// and DialOptions as the endpoints; the nodes then need no forwarding
	// hop. Until routing is learned, when the leader is unknown or cannot
	// be reached, and on every retry, calls go to the Endpoints round-robin.
	// Endpoints that do not serve routing (routers) are used round-robin.
	// Turn it off when the nodes' topology addresses cannot be reached from
	// this process (only the Endpoints can).
	DisableRouting bool

	// DisableBatching sends every call as its own unary RPC. With batching
	// on (the default), calls that go to the same connection while two
	// RPCs are already in flight there wait for one to end and go together
	// in one Batch RPC (a call with nothing ahead of it goes at once, as
	// its unary RPC); a node that does not know Batch (older than v1.2)
	// gets unary RPCs from then on. Waiting reserves, completes larger
	// than 64 KiB and calls whose context carries outgoing metadata always
	// go on their own.
	DisableBatching bool

	// RoutingRefresh is how often routing is asked for again (leaders
	// are also learned from every answer). Zero means DefaultRoutingRefresh.
	RoutingRefresh time.Duration
}

// DefaultConfig returns a Config with every default filled in, dialing
// endpoints in plaintext.
func DefaultConfig(endpoints ...string) Config {
	return Config{
		Endpoints:      endpoints,
		MaxAttempts:    DefaultMaxAttempts,
		BaseBackoff:    DefaultBaseBackoff,
		MaxBackoff:     DefaultMaxBackoff,
		RequestTimeout: DefaultRequestTimeout,
		RoutingRefresh: DefaultRoutingRefresh,
	}
}

// Validate reports every problem with the Config at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Endpoints) == 0 {
		errs = append(errs, errors.New("client: config: Endpoints is empty; give at least one host:port of an idem node or router"))
	}
	for i, ep := range c.Endpoints {
		if _, port, err := net.SplitHostPort(ep); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("client: config: Endpoints[%d] = %q is not host:port", i, ep))
		}
	}
	if c.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("client: config: MaxAttempts = %d is negative; use 1 to disable retries or 0 for the default", c.MaxAttempts))
	}
	if c.BaseBackoff < 0 {
		errs = append(errs, fmt.Errorf("client: config: BaseBackoff = %v is negative", c.BaseBackoff))
	}
	if c.MaxBackoff < 0 {
		errs = append(errs, fmt.Errorf("client: config: MaxBackoff = %v is negative", c.MaxBackoff))
	}
	if c.BaseBackoff > 0 && c.MaxBackoff > 0 && c.MaxBackoff < c.BaseBackoff {
		errs = append(errs, fmt.Errorf("client: config: MaxBackoff = %v is below BaseBackoff = %v", c.MaxBackoff, c.BaseBackoff))
	}
	if c.RoutingRefresh < 0 {
		errs = append(errs, fmt.Errorf("client: config: RoutingRefresh = %v is negative", c.RoutingRefresh))
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, fmt.Errorf("client: config: RequestTimeout = %v is negative", c.RequestTimeout))
	}
	if c.Token != "" && c.TLS == nil {
		errs = append(errs, errors.New("client: config: Token needs TLS: set TLS (a bearer token is never sent in plaintext)"))
	}
	return errors.Join(errs...)
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BaseBackoff == 0 {
		c.BaseBackoff = DefaultBaseBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(DefaultMaxBackoff, c.BaseBackoff)
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.RoutingRefresh == 0 {
		c.RoutingRefresh = DefaultRoutingRefresh
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// BearerToken is a grpc.PerRPCCredentials sending "authorization: Bearer
// TOKEN"; it requires transport security. Config.Token uses it.
type BearerToken string

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (BearerToken) RequireTransportSecurity() bool { return true }
