package server

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// inflightRetryAfter is the Retry-After of a request refused for the bytes
// in flight: they drain as the requests ahead of it are answered.
const inflightRetryAfter = time.Second

// inflight bounds the request bytes the server holds at once
// (Config.MaxInflightBytes): each JSON request's body (as declared, or
// its limit when sent chunked) and each unary gRPC request's message, from
// when it is admitted until it is answered. A request that would take the
// total past the bound while others are in flight gets 503 UNAVAILABLE
// with Retry-After; a request alone always passes (its own size limit
// bounds it). It keeps many concurrent large requests (4 MiB batches)
// from growing the process's memory with them.
type inflight struct {
	max   int64 // 0: no bound
	bytes atomic.Int64
	gauge prometheus.GaugeFunc
}

func newInflight(max int64, reg *prometheus.Registry) (*inflight, error) {
	f := &inflight{max: max}
	f.gauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_api_inflight_request_bytes",
		Help: "Request bytes (JSON bodies, gRPC messages) this process holds in requests not yet answered; bounded by --max-inflight-bytes."},
		func() float64 { return float64(f.bytes.Load()) })
	if _, err := register(reg, prometheus.Collector(f.gauge)); err != nil {
		return nil, err
	}
	return f, nil
}

// acquire admits a request of n bytes: release (call it once answered),
// or the refusal.
func (f *inflight) acquire(n int64) (release func(), e *Error) {
	if n <= 0 {
		return func() {}, nil
	}
	for {
		cur := f.bytes.Load()
		if f.max > 0 && cur > 0 && cur+n > f.max {
			return nil, &Error{Code: CodeUnavailable, RetryAfter: inflightRetryAfter,
				Message: fmt.Sprintf("this process holds %d bytes of requests in flight; a %d-byte request would pass its --max-inflight-bytes of %d: retry after Retry-After", cur, n, f.max)}
		}
		if f.bytes.CompareAndSwap(cur, cur+n) {
			return func() { f.bytes.Add(-n) }, nil
		}
	}
}

// interceptor admits each unary RPC's message (a Batch's operations
// travel in it and are not admitted again).
func (f *inflight) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return handler(ctx, req)
	}
	release, e := f.acquire(int64(proto.Size(m)))
	if e != nil {
		return nil, e.GRPCStatus().Err()
	}
	defer release()
	return handler(ctx, req)
}

// declaredBytes is what a JSON request's body may hold: its declared
// length, or when sent chunked the endpoint's limit.
func (h *httpAPI) declaredBytes(r *http.Request, rt route) int64 {
	if r.ContentLength >= 0 {
		return r.ContentLength
	}
	if rt.endpoint == endpointBatchReserve || rt.endpoint == endpointBatchComplete {
		return h.batchBodyLimit()
	}
	return h.s.cfg.maxRequestBytes()
}
