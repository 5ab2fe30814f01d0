package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/rpcbatch"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Client talks to idem over gRPC. It is safe for concurrent use; make one per
// process and share it.
type Client struct {
	cfg    Config
	log    *slog.Logger
	conns  []*grpc.ClientConn
	stubs  []idemv1.IdempotencyClient
	next   atomic.Uint64
	closed atomic.Bool
	// routing is nil with Config.DisableRouting.
	routing          *leaderRouter
	endpointAttempts atomic.Uint64 // without routing
	batch            rpcbatch.Stats
}

// Stats are the client's routing figures, for tests and status pages.
type Stats struct {
	// LeaderAttempts counts attempts sent straight to the leader of the
	// key's shard.
	LeaderAttempts uint64
	// EndpointAttempts counts attempts sent to an endpoint round-robin:
	// routing off or not learned yet, the leader unknown or its connection
	// not up, and every retry.
	EndpointAttempts uint64
	// RingFingerprint is the fingerprint of the nodes' ring the client
	// places keys with; empty while it has none (calls go round-robin).
	RingFingerprint string
	// KnownLeaders is how many shards the client knows a leader of.
	KnownLeaders int
	// BatchRPCs counts the Batch RPCs sent, BatchedCalls the attempts they
	// answered (BatchedCalls/BatchRPCs is the mean batch size), and
	// BatchFallbacks the queued attempts sent on their own after all (the
	// node does not know Batch, or withheld a large result).
	BatchRPCs, BatchedCalls, BatchFallbacks uint64
}

// Stats returns the client's routing figures.
func (c *Client) Stats() Stats {
	var s Stats
	if c.routing != nil {
		c.routing.stats(&s)
	} else {
		s.EndpointAttempts = c.endpointAttempts.Load()
	}
	s.BatchRPCs = c.batch.Batches.Load()
	s.BatchedCalls = c.batch.BatchedCalls.Load()
	s.BatchFallbacks = c.batch.Fallbacks.Load()
	return s
}

// New validates cfg and returns a Client. It does not connect: connections
// are made on first use, so New succeeds while the endpoints are down.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	// Options given later win, so the caller's credentials replace plaintext.
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(traceInterceptor)}
	if cfg.TLS != nil {
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS)))
	}
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(BearerToken(cfg.Token)))
	}
	opts = append(opts, cfg.DialOptions...)
	c := &Client{cfg: cfg, log: cfg.Logger}
	for _, ep := range cfg.Endpoints {
		conn, err := grpc.NewClient(ep, opts...)
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("client: endpoint %q: %w", ep, err)
		}
		c.conns = append(c.conns, conn)
		c.stubs = append(c.stubs, c.newStub(conn))
	}
	// Start different processes at different endpoints, so that many clients
	// configured alike do not all hit the first one.
	c.next.Store(rand.Uint64N(uint64(len(c.stubs))))
	if !cfg.DisableRouting {
		c.routing = newLeaderRouter(c, opts)
	}
	return c, nil
}

// newStub is the stub of a connection: with batching (package rpcbatch; one
// Batcher per connection, shared by the calls routed to a leader there and
// those sent round-robin) unless Config.DisableBatching.
func (c *Client) newStub(conn *grpc.ClientConn) idemv1.IdempotencyClient {
	if c.cfg.DisableBatching {
		return idemv1.NewIdempotencyClient(conn)
	}
	raw := idemv1.NewIdempotencyClient(conn)
	b := rpcbatch.New(rpcbatch.Config{
		Send: func(ctx context.Context, ops []context.Context, req *idemv1.BatchRequest) (*idemv1.BatchResponse, error) {
			return raw.Batch(withTraceContext(ctx, ops[0]), req)
		},
		Stats: &c.batch,
	})
	return &rpcbatch.Stub{IdempotencyClient: raw, Pick: func(context.Context) *rpcbatch.Batcher { return b }}
}

// Close stops the routing refresher and closes every connection. Calls in
// flight fail; later calls return ErrClosed.
func (c *Client) Close() error {
	c.closed.Store(true)
	var errs []error
	if c.routing != nil {
		errs = append(errs, c.routing.close())
	}
	for _, conn := range c.conns {
		if err := conn.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// attemptFunc runs one attempt of a call on stub, passing opts to the RPC.
type attemptFunc func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) error

// invoke runs attempt with retries for the key (namespace, key): the first
// attempt goes to the leader of the key's shard when routing knows it and
// its connection is up (an empty key names no shard: a batch call), else to
// the next endpoint round-robin; on a
// retryable failure it backs off and tries again on the next endpoint, up
// to MaxAttempts in all. retried reports whether an earlier attempt failed
// in a way that may have been applied (its answer was lost), which matters
// to non-idempotent calls like release.
func (c *Client) invoke(ctx context.Context, op, namespace, key string, attempt attemptFunc) (retried bool, err error) {
	return c.invokeWaiting(ctx, op, namespace, key, 0, attempt)
}

// invokeWaiting is invoke for a call that needs more than RequestTimeout an
// attempt: one the store may hold for up to a waiting reserve's wait on
// purpose, or one whose payload the store writes to a majority of its
// replicas before it answers (payloadAllowance). Each attempt's timeout is
// RequestTimeout plus extra.
func (c *Client) invokeWaiting(ctx context.Context, op, namespace, key string, extra time.Duration, attempt attemptFunc) (retried bool, err error) {
	if c.closed.Load() {
		return false, fmt.Errorf("%w: %s", ErrClosed, op)
	}
	var route callRoute
	routed := false
	if c.routing != nil && key != "" {
		route, routed = c.routing.route(namespace, key)
	}
	start := c.next.Add(1)
	var lastErr error
	for n := 1; ; n++ {
		idx := int((start + uint64(n-1)) % uint64(len(c.stubs)))
		stub, leader, target := c.stubs[idx], "", c.cfg.Endpoints[idx]
		if routed && n == 1 {
			if s, id, ok := c.routing.leaderStub(route); ok {
				stub, leader, target = s, id, id
			}
		}
		switch {
		case leader != "":
			c.routing.leaderAttempts.Add(1)
		case c.routing != nil:
			c.routing.endpointAttempts.Add(1)
		default:
			c.endpointAttempts.Add(1)
		}
		var header metadata.MD
		attemptCtx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout+extra)
		err := attempt(attemptCtx, stub, grpc.Header(&header))
		cancel()
		if routed {
			c.routing.learn(route, leader, header, err)
		}
		if err == nil {
			return n > 1, nil
		}
		if cause := ended(ctx); cause != nil {
			// An attempt cut short by the caller's context says nothing new;
			// the failure of the attempt before it says why we were retrying.
			if lastErr == nil {
				lastErr = err
			}
			return n > 1, fmt.Errorf("client: %s: %w (last error: %w)", op, cause, lastErr)
		}
		lastErr = err
		if c.closed.Load() {
			return n > 1, fmt.Errorf("%w: %s: %w", ErrClosed, op, lastErr)
		}
		if !retryable(lastErr) {
			return n > 1, mapError(op, lastErr)
		}
		if n >= c.cfg.MaxAttempts {
			return true, fmt.Errorf("%w: %s failed %d attempts: %w", ErrUnavailable, op, n, lastErr)
		}
		wait := c.backoff(n)
		c.log.Debug("retrying", "op", op, "target", target, "attempt", n, "wait", wait, "err", lastErr)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return true, fmt.Errorf("client: %s: %w (last error: %w)", op, context.Cause(ctx), lastErr)
		case <-t.C:
		}
	}
}

// payloadAllowance is what an attempt carrying n bytes of request gets on
// top of RequestTimeout: a second per MiB, as a node gives a command it
// forwards to its shard's leader (forward.PayloadAllowance). A completion of
// several megabytes is written to the leader's log and a majority of the
// replicas, and applied, before it is answered; on a loaded region that takes
// longer than a small command's budget, and retrying it on a timeout only
// sends the megabytes again. A typical 1 KB request gets ~1 ms.
func payloadAllowance(n int) time.Duration {
	return time.Duration(n) * time.Second / (1 << 20)
}

// ended returns why ctx ended, or nil. gRPC can fail a call on its deadline
// a moment before the context's own timer fires, so a passed deadline counts
// as ended too.
func ended(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// retryable reports whether an attempt may succeed when repeated: the store
// could not decide (no leader, leader changed, region lost) or the attempt
// timed out. Every idem call is safe to repeat with the same owner token.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// mapError turns a decided gRPC failure into the package's sentinel errors,
// keeping the status in the chain.
func mapError(op string, err error) error {
	var sentinel error
	switch status.Code(err) {
	case codes.FailedPrecondition:
		sentinel = ErrNotOwner
	case codes.NotFound:
		sentinel = ErrNotFound
	case codes.InvalidArgument:
		sentinel = ErrInvalidArgument
	case codes.ResourceExhausted:
		sentinel = ErrPayloadTooLarge
	default:
		return fmt.Errorf("client: %s: %w", op, err)
	}
	return fmt.Errorf("%w: %s: %w", sentinel, op, err)
}

// backoff returns the jittered wait before attempt n+1: BaseBackoff doubled
// per attempt, capped at MaxBackoff, then drawn from [d/2, d].
func (c *Client) backoff(n int) time.Duration {
	d := c.cfg.BaseBackoff
	for i := 1; i < n && d < c.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.cfg.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}
