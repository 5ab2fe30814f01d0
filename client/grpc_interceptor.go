package client

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/idem-dev/idem/httpidem"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Defaults of InterceptorConfig.
const (
	// DefaultMetadataKey is the metadata entry that carries the idempotency
	// key of a call.
	DefaultMetadataKey = "idempotency-key"
	// ReplayedMetadataKey is set ("true") in the header metadata of a
	// replayed answer.
	ReplayedMetadataKey = "idempotent-replayed"
)

// DefaultReleaseCodes are the handler error codes after which the key is
// released so that a retry runs the handler again; they mirror the HTTP
// release statuses (5xx, 408, 429) plus the codes gRPC itself calls
// retryable. Every other error (InvalidArgument, NotFound, AlreadyExists,
// PermissionDenied, FailedPrecondition, OutOfRange, Unauthenticated) is
// final: stored and replayed like a response.
var DefaultReleaseCodes = []codes.Code{
	codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
	codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss,
}

// InterceptorConfig configures UnaryServerInterceptor. A zero field takes the
// default named in its comment.
type InterceptorConfig struct {
	// MetadataKey is the incoming metadata entry holding the key (a bare
	// value or a structured-field string, as the HTTP header). Empty means
	// DefaultMetadataKey.
	MetadataKey string
	// RequireKey answers a call without a key InvalidArgument instead of
	// running it.
	RequireKey bool
	// Namespace names the caller of a call. Nil means: a verified TLS client
	// certificate's namespace (CertNamespace), else DefaultNamespace. An
	// error gives Unauthenticated, an invalid namespace InvalidArgument.
	Namespace func(ctx context.Context) (string, error)
	// CertNamespace derives a namespace from a verified client certificate;
	// nil means the common name when it is a valid namespace, else "spki-"
	// and 40 hex digits of the SHA-256 of its public key.
	CertNamespace func(cert *x509.Certificate) (string, error)
	// DefaultNamespace is the namespace without another identity. Empty
	// means "default".
	DefaultNamespace string
	// Lease and Retention are Do's (WithLease, WithRetention); zero means
	// their defaults (30s, the store's 24h).
	Lease     time.Duration
	Retention time.Duration
	// ReleaseCodes are the handler error codes that release the key. Nil
	// means DefaultReleaseCodes.
	ReleaseCodes []codes.Code
	// Logger receives calls whose answer could not be stored. Nil means the
	// Client's.
	Logger *slog.Logger
}

// InterceptorOption adjusts an InterceptorConfig. Any
// func(*InterceptorConfig) is one.
type InterceptorOption func(*InterceptorConfig)

// Stored representation of a gRPC answer.
const (
	grpcStatusHeader = "Grpc-Status"       // the code, decimal; "0" for a response
	grpcTypeHeader   = "Grpc-Message-Type" // the response's full proto name
)

// errNotStorable: the handler's answer is not a proto message.
var errNotStorable = errors.New("client: the handler's response is not a proto message")

// UnaryServerInterceptor returns a gRPC interceptor that makes unary calls
// carrying an idempotency key (metadata entry "idempotency-key") run at most
// once per key, over c (built on Do):
//
//   - The first call runs the handler with the lease in its context
//     (FencingToken, LeaseFromContext), renewing it while the handler runs.
//     A response, or an error whose code is not in ReleaseCodes, is
//     stored: later calls with the key and the same request get it back,
//     with header metadata idempotent-replayed: true. The response is
//     stored as its deterministic proto encoding and type name, and decoded
//     on replay from the global proto registry; an error as its
//     google.rpc.Status, details included. Header and trailer metadata the
//     handler sets are not stored.
//   - An error with a code in ReleaseCodes (Unavailable, Internal, ...)
//     releases the key, so the retry runs the handler again.
//   - While another call with the key runs: Aborted (gRPC's code for a
//     conflict to be retried at a higher level; not FailedPrecondition,
//     which tells clients not to retry until the system changes). The
//     error names the wait.
//   - The key used with another method or request message: FailedPrecondition.
//   - The store cannot decide: Unavailable, and the handler does not run.
//   - No key: the handler runs as usual (InvalidArgument with RequireKey).
//
// The request's fingerprint is the SHA-256 of the full method name and the
// deterministic encoding of the request message. Unlike the HTTP middleware,
// the handler's context is the call's own: a client that cancels the call
// cancels the handler, and a handler that returns Canceled releases the key.
// A response that cannot be stored (not a proto message, or larger than the
// store keeps) is returned and its key released, with a warning.
//
// It panics if the options are invalid.
func UnaryServerInterceptor(c *Client, opts ...InterceptorOption) grpc.UnaryServerInterceptor {
	cfg := InterceptorConfig{}
	for _, opt := range opts {
		opt(&cfg)
	}
	if c == nil {
		panic(fmt.Sprintf("%v: interceptor: the Client is nil", ErrInvalidArgument))
	}
	if cfg.MetadataKey == "" {
		cfg.MetadataKey = DefaultMetadataKey
	}
	if cfg.DefaultNamespace == "" {
		cfg.DefaultNamespace = httpidem.DefaultNamespace
	}
	if !httpidem.ValidNamespace(cfg.DefaultNamespace) {
		panic(fmt.Sprintf("%v: interceptor: DefaultNamespace %q is not a valid namespace", ErrInvalidArgument, cfg.DefaultNamespace))
	}
	if cfg.ReleaseCodes == nil {
		cfg.ReleaseCodes = DefaultReleaseCodes
	}
	if cfg.Logger == nil {
		cfg.Logger = c.log
	}
	if _, err := leaseMillis(cfg.Lease); err != nil {
		panic(fmt.Sprintf("interceptor: %v", err))
	}
	if _, err := retentionSeconds(cfg.Retention); err != nil {
		panic(fmt.Sprintf("interceptor: %v", err))
	}
	release := make(map[codes.Code]bool)
	for _, code := range cfg.ReleaseCodes {
		release[code] = true
	}
	ic := &interceptor{c: c, cfg: cfg, release: release}
	return ic.intercept
}

type interceptor struct {
	c       *Client
	cfg     InterceptorConfig
	release map[codes.Code]bool
}

func (ic *interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	key, present, err := httpidem.ParseKey(md.Get(ic.cfg.MetadataKey))
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if !present {
		if ic.cfg.RequireKey {
			return nil, status.Errorf(codes.InvalidArgument, "%s needs an idempotency key in the %q metadata entry: send a unique key and the same key with every retry of the call", info.FullMethod, ic.cfg.MetadataKey)
		}
		return handler(ctx, req)
	}
	ns, err := ic.namespace(ctx)
	if err != nil {
		return nil, err
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "%s: the request is not a proto message, so it cannot be fingerprinted", info.FullMethod)
	}
	fp, err := grpcFingerprint(info.FullMethod, msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: fingerprinting the request: %v", info.FullMethod, err)
	}

	var (
		ran     bool
		handled any
		herr    error
	)
	res, err := ic.c.Do(ctx, ns, key, func(ctx context.Context, l Lease) (Response, error) {
		ran = true
		ctx = httpidem.WithLease(ctx, httpidem.Lease{
			Namespace: ns, Key: key, FencingToken: l.FencingToken, Reclaimed: l.Reclaimed,
			PreviousFencingToken: l.PreviousFencingToken, ExpiresAt: l.ExpiresAt,
		})
		handled, herr = handler(ctx, req)
		return ic.stored(handled, herr)
	}, WithFingerprint(fp), WithMaxWait(0), WithLease(ic.cfg.Lease), WithRetention(ic.cfg.Retention))
	if ran {
		if err != nil && herr == nil {
			ic.cfg.Logger.Warn("the handler's answer was not stored; a retry may run it again", "namespace", ns, "key", key, "method", info.FullMethod, "err", err)
		}
		return handled, herr
	}
	if err != nil {
		return nil, ic.doError(ctx, err)
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadataKey, "true"))
	return replayGRPC(res.Response)
}

// stored turns the handler's answer into the Response Do stores, or an error
// that makes Do release the key.
func (ic *interceptor) stored(resp any, herr error) (Response, error) {
	if herr != nil {
		st := status.Convert(herr)
		if ic.release[st.Code()] {
			return Response{}, herr
		}
		body, err := proto.Marshal(st.Proto())
		if err != nil {
			return Response{}, errors.Join(errNotStorable, herr)
		}
		return Response{
			Status:  httpStatusOfCode(st.Code()),
			Headers: map[string]string{grpcStatusHeader: strconv.Itoa(int(st.Code()))},
			Body:    body,
		}, Permanent(herr)
	}
	m, ok := resp.(proto.Message)
	if !ok {
		return Response{}, errNotStorable
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return Response{}, fmt.Errorf("%w: %w", errNotStorable, err)
	}
	return Response{
		Status: 200,
		Headers: map[string]string{
			grpcStatusHeader: "0",
			grpcTypeHeader:   string(m.ProtoReflect().Descriptor().FullName()),
		},
		Body: body,
	}, nil
}

// replayGRPC decodes a stored answer.
func replayGRPC(r Response) (any, error) {
	code, err := strconv.Atoi(r.Headers[grpcStatusHeader])
	if err != nil {
		return nil, status.Errorf(codes.Internal, "the stored answer is not a gRPC answer (no %s)", grpcStatusHeader)
	}
	if code != 0 {
		var sp spb.Status
		if err := proto.Unmarshal(r.Body, &sp); err != nil {
			return nil, status.Errorf(codes.Internal, "decoding the stored error: %v", err)
		}
		return nil, status.ErrorProto(&sp)
	}
	name := r.Headers[grpcTypeHeader]
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "the stored response's type %q is not registered: %v", name, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(r.Body, m); err != nil {
		return nil, status.Errorf(codes.Internal, "decoding the stored %s: %v", name, err)
	}
	return m, nil
}

// doError maps a failure of Do before the handler ran to a gRPC status.
func (ic *interceptor) doError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrInProgress):
		return status.Error(codes.Aborted, "another call with this idempotency key is running: retry later to get its answer")
	case errors.Is(err, ErrFingerprintMismatch):
		return status.Error(codes.FailedPrecondition, "this idempotency key was used for another method or request: use a new key for a new request")
	case errors.Is(err, ErrExpired):
		// gRPC has no 410: the call ran long ago and its answer is gone.
		return status.Error(codes.FailedPrecondition, "this idempotency key was used long ago and its stored answer has expired: the call is not run again; use a new key for a new request")
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, ErrUnavailable), errors.Is(err, ErrClosed), errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.Unavailable, "the idempotency store could not decide in time, so the call did not run: retry it with the same key")
	case errors.Is(err, ErrInvalidArgument):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	ic.cfg.Logger.Error("idempotency store failed", "err", err)
	return status.Error(codes.Internal, "the idempotency store failed")
}

// namespace names the caller of the call.
func (ic *interceptor) namespace(ctx context.Context) (string, error) {
	ns := ic.cfg.DefaultNamespace
	switch {
	case ic.cfg.Namespace != nil:
		v, err := ic.cfg.Namespace(ctx)
		if err != nil {
			return "", status.Errorf(codes.Unauthenticated, "the caller could not be identified: %v", err)
		}
		ns = v
	default:
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
				derive := ic.cfg.CertNamespace
				if derive == nil {
					derive = httpidem.NamespaceFromCert
				}
				v, err := derive(ti.State.VerifiedChains[0][0])
				if err != nil {
					return "", status.Errorf(codes.Unauthenticated, "no namespace for the client certificate: %v", err)
				}
				ns = v
			}
		}
	}
	if !httpidem.ValidNamespace(ns) {
		return "", status.Errorf(codes.InvalidArgument, "the caller namespace %q is not valid: use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit", ns)
	}
	return ns, nil
}

// grpcFingerprint is "sha256:" and the hex SHA-256 of the length-prefixed
// method name and the request's deterministic encoding.
func grpcFingerprint(method string, req proto.Message) (string, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(method)))
	h.Write([]byte("idem-grpc-fingerprint-v1"))
	h.Write(n[:])
	h.Write([]byte(method))
	h.Write(body)
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// httpStatusOfCode is the HTTP status conventionally paired with a gRPC code
// (as grpc-gateway maps them); it is what a stored error's status says.
func httpStatusOfCode(c codes.Code) int {
	switch c {
	case codes.OK:
		return 200
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return 400
	case codes.DeadlineExceeded:
		return 504
	case codes.NotFound:
		return 404
	case codes.AlreadyExists, codes.Aborted:
		return 409
	case codes.PermissionDenied:
		return 403
	case codes.Unauthenticated:
		return 401
	case codes.ResourceExhausted:
		return 429
	case codes.Unimplemented:
		return 501
	case codes.Unavailable:
		return 503
	}
	return 500
}
