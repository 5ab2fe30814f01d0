package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/internal/tracing"
	"github.com/idem-dev/idem/security/auth"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Batch calls (v1.2): POST /v1/namespaces/{ns}/keys:batch-reserve and
// :batch-complete, gRPC BatchReserve and BatchComplete. Each item is
// validated and applied exactly as its single call (Server.apply: the same
// validator, the same backend, so forwarding to other shards' leaders
// coalesces into the internal Batch RPCs of rpcbatch), and answered in item
// order; one item's error is that item's result alone. Items of different
// keys run concurrently, items of one key one after the other in item order
// (forEachItem).

const (
	// MaxBatchItems is the most items one batch call may carry.
	MaxBatchItems = 1000
	// batchItemWorkers bounds how many items of one batch call are in flight
	// at once: enough to fill the forwarding batches and the leaders'
	// proposal buffers, few enough that a batch holds no more goroutines.
	batchItemWorkers = 128
	// minBatchBodyBytes is the least body a batch call accepts whatever the
	// single-call limit: 1000 reserves of maximal fields fit in it.
	minBatchBodyBytes = 4 << 20
	// maxBatchBodyBytes bounds a batch call's body: completes with large
	// responses go in several batches.
	maxBatchBodyBytes = 16 << 20
)

// Endpoint names of the batch calls, as in metrics labels.
const (
	endpointBatchReserve  = "batch_reserve"
	endpointBatchComplete = "batch_complete"
)

// The fields of one batch item.
var (
	batchBodyFields    = []string{"items"}
	reserveItemFields  = []string{"fingerprint", "key", "lease_ms", "owner_token"}
	completeItemFields = []string{"key", "owner_token", "response", "retention_s"}
)

// forEachItem runs f(i) for i in [0, n) on at most batchItemWorkers
// goroutines and returns when all are done. Items of one key (key(i), when
// ok) run one after the other in item order, so a batch that names a key
// twice is answered as the two single calls sent one after the other would
// be; items of different keys run concurrently.
func forEachItem(n int, key func(i int) (string, bool), f func(i int)) {
	runs := make([][]int, 0, n)
	byKey := make(map[string]int, n)
	for i := range n {
		k, ok := key(i)
		if !ok {
			runs = append(runs, []int{i})
			continue
		}
		if r, seen := byKey[k]; seen {
			runs[r] = append(runs[r], i)
			continue
		}
		byKey[k] = len(runs)
		runs = append(runs, []int{i})
	}
	sem := make(chan struct{}, batchItemWorkers)
	var wg sync.WaitGroup
	for _, run := range runs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			for _, i := range run {
				f(i)
			}
		})
	}
	wg.Wait()
}

// checkItemCount is the INVALID_ARGUMENT of a batch of n items, or nil.
func checkItemCount(n int) *Error {
	switch {
	case n == 0:
		return errorf(CodeInvalidArgument, "items is empty: a batch carries 1 to %d items", MaxBatchItems)
	case n > MaxBatchItems:
		return errorf(CodeInvalidArgument, "a batch carries %d items, more than %d: split it", n, MaxBatchItems)
	}
	return nil
}

// decodeBatchItems decodes {"items": [...]} into the items' raw values; a
// body that is not such an object, or whose list is empty or too long, is
// the whole call's error.
func decodeBatchItems(data []byte) ([]json.RawMessage, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, batchBodyFields, "request body", buf[:0])
	if e := p.err(); e != nil {
		return nil, e
	}
	raw := f.get("items")
	if isNull(raw) {
		return nil, errorf(CodeInvalidArgument, "items is missing: send {\"items\": [...]}, 1 to %d items", MaxBatchItems)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errorf(CodeInvalidArgument, "items must be a JSON array of objects, not %s", jsonKind(raw))
	}
	if e := checkItemCount(len(items)); e != nil {
		return nil, e
	}
	return items, nil
}

// itemKey decodes the key of one item (p collects its problems).
func itemKey(p *problems, f jsonFields) string {
	if isNull(f.get("key")) {
		p.addf("key is missing: each item names its key")
		return ""
	}
	return jsonString(p, f, "key", "key")
}

// itemObject checks that raw is a JSON object before jsonObject reads it
// (jsonObject takes an empty value for an empty object).
func itemObject(p *problems, raw json.RawMessage, allowed []string, buf jsonFields) jsonFields {
	if len(raw) == 0 || raw[0] != '{' {
		p.addf("an item must be a JSON object like {\"key\": ...}, not %s", jsonKind(raw))
		return nil
	}
	return jsonObject(p, raw, allowed, "item", buf)
}

func decodeReserveItem(ns string, raw json.RawMessage) (reserveParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := itemObject(&p, raw, reserveItemFields, buf[:0])
	r := reserveParams{
		Namespace:   ns,
		Key:         itemKey(&p, f),
		Fingerprint: jsonString(&p, f, "fingerprint", "fingerprint"),
		LeaseMs:     jsonInt(&p, f, "lease_ms", "lease_ms"),
		OwnerToken:  jsonString(&p, f, "owner_token", "owner_token"),
	}
	return r, p.err()
}

func decodeCompleteItem(ns string, raw json.RawMessage) (completeParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := itemObject(&p, raw, completeItemFields, buf[:0])
	r := completeFromFields(&p, f)
	r.Namespace, r.Key = ns, itemKey(&p, f)
	return r, p.err()
}

// errorResult is an item's error as the JSON API writes it.
func errorResult(e *Error) errorBodyJSON {
	return errorBodyJSON{Error: errorJSON{Code: e.Code, Message: e.Message}}
}

// serveBatch serves :batch-reserve and :batch-complete.
func (h *httpAPI) serveBatch(w http.ResponseWriter, r *http.Request, rt route, fail func(*Error)) (outcome string) {
	if err := ValidateNamespace(rt.namespace); err != nil {
		e := err.(*Error)
		fail(e)
		return string(e.Code)
	}
	body, e := h.readBatchBody(r, w)
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	items, e := decodeBatchItems(body)
	if charge, ok := auth.BatchCharge(r.Context()); ok {
		// Every item pays, valid or not, before any is decoded.
		if err := charge(len(items)); err != nil {
			e = authError(err)
		}
	}
	if e != nil {
		fail(e)
		return string(e.Code)
	}
	if h.s.tracer != nil {
		trace.SpanFromContext(r.Context()).SetAttributes(tracing.Items.Int(len(items)))
	}
	results := make([]any, len(items))
	cmds := make([]*fsm.Command, len(items))
	for i, raw := range items {
		if cmds[i], e = h.batchCommand(rt, raw); e != nil {
			results[i] = errorResult(e)
		}
	}
	ctx := r.Context()
	forEachItem(len(items), func(i int) (string, bool) {
		if cmds[i] == nil {
			return "", false
		}
		return cmds[i].Key, true
	}, func(i int) {
		if cmds[i] == nil {
			return
		}
		res, e := h.batchItem(ctx, cmds[i])
		if e != nil {
			results[i] = errorResult(e)
			return
		}
		results[i] = res
	})
	writeJSON(w, http.StatusOK, struct {
		Results []any `json:"results"`
	}{results})
	return outcomeOK
}

// batchCommand decodes and validates one item of a JSON batch call.
func (h *httpAPI) batchCommand(rt route, raw json.RawMessage) (*fsm.Command, *Error) {
	if rt.endpoint == endpointBatchReserve {
		params, e := decodeReserveItem(rt.namespace, raw)
		if e != nil {
			return nil, e
		}
		return h.s.validate.reserveCommand(params)
	}
	params, e := decodeCompleteItem(rt.namespace, raw)
	if e != nil {
		return nil, e
	}
	return h.s.validate.completeCommand(params)
}

// batchItem applies the command of one item of a JSON batch call and is its
// answer, as the single call would have written it.
func (h *httpAPI) batchItem(ctx context.Context, cmd *fsm.Command) (any, *Error) {
	res, e := h.s.apply(ctx, cmd)
	if e != nil {
		return nil, e
	}
	if cmd.Op == fsm.OpReserve {
		return reserveJSON(cmd, res), nil
	}
	return completeJSON{CompletedAt: formatTime(res.CompletedAt), ExpiresAt: formatTime(res.ExpiresAt)}, nil
}

// authError is the server's Error of an authorizer's refusal.
func authError(err error) *Error {
	var ae *auth.Error
	if errors.As(err, &ae) {
		return &Error{Code: Code(ae.Code), Message: ae.Message, RetryAfter: ae.RetryAfter}
	}
	return errorf(CodeInternal, "%s", internalMessage)
}

// batchBodyLimit is the largest batch body: the larger of the single
// call's limit and minBatchBodyBytes, never more than maxBatchBodyBytes.
func (h *httpAPI) batchBodyLimit() int64 {
	return min(max(h.s.cfg.maxRequestBytes(), minBatchBodyBytes), maxBatchBodyBytes)
}

// readBatchBody reads a batch call's body, up to the larger of the single
// call's limit and minBatchBodyBytes, never more than maxBatchBodyBytes.
func (h *httpAPI) readBatchBody(r *http.Request, w http.ResponseWriter) ([]byte, *Error) {
	limit := h.batchBodyLimit()
	if r.ContentLength > limit {
		return nil, errorf(CodePayloadTooLarge, "payload too large: a batch body is at most %d bytes: split it", limit)
	}
	body, err := readAllLimited(w, r, limit)
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return nil, errorf(CodePayloadTooLarge, "payload too large: a batch body is at most %d bytes: split it", limit)
	}
	if err != nil {
		return nil, errorf(CodeInvalidArgument, "could not read the request body (%v): send it again", err)
	}
	return body, nil
}

// itemError is an item's error as gRPC batch results carry it.
func itemError(err error) *idemv1.BatchError {
	return idemv1.BatchErrorFromStatus(status.Convert(err))
}

// itemNamespace is the namespace of a gRPC batch item: the request's, which
// the item repeats or leaves empty.
func itemNamespace(ns, item string) (string, error) {
	if item != "" && item != ns {
		return "", (&Error{Code: CodeInvalidArgument, Message: fmt.Sprintf(
			"the item's namespace %q differs from the batch's %q: a batch is one namespace (leave the item's empty)", truncate(item, 64), truncate(ns, 64))}).GRPCStatus().Err()
	}
	return ns, nil
}

// batchItemRequest is an item of a gRPC batch call.
type batchItemRequest interface {
	GetNamespace() string
	GetKey() string
}

// runGRPCBatch checks a gRPC batch call of items in namespace ns and answers
// each item with one (run on the item with the batch's namespace, its leader
// hint kept out of the call's header) or with its error, in item order.
func runGRPCBatch[I batchItemRequest, R any](ctx context.Context, ns string, items []I,
	one func(ctx context.Context, ns string, item I) (R, error), result func(R, *idemv1.BatchError) R) ([]R, error) {
	if e := checkItemCount(len(items)); e != nil {
		return nil, e
	}
	if err := ValidateNamespace(ns); err != nil {
		return nil, err
	}
	results := make([]R, len(items))
	forEachItem(len(items), func(i int) (string, bool) {
		return items[i].GetKey(), true
	}, func(i int) {
		_, err := itemNamespace(ns, items[i].GetNamespace())
		var res R
		if err == nil {
			octx, _ := idemv1.WithBatchOpLeader(ctx)
			res, err = one(octx, ns, items[i])
		}
		if err != nil {
			results[i] = result(res, itemError(err))
			return
		}
		results[i] = res
	})
	return results, nil
}

// item runs one item of a gRPC batch call as its unary RPC (method),
// through the interceptors registered for the call's items
// (idemv1.WithBatchOpInterceptor: the authorizer's, which charges each item
// to the caller's rate).
func (g *grpcService) item(ctx context.Context, method string, req any, handler grpc.UnaryHandler) (any, error) {
	return idemv1.ChainBatchOp(ctx, idemv1.BatchOpInterceptors(ctx), req, &grpc.UnaryServerInfo{Server: g, FullMethod: method}, handler)
}

func (g *grpcService) BatchReserve(ctx context.Context, req *idemv1.BatchReserveRequest) (_ *idemv1.BatchReserveResponse, err error) {
	defer g.recoverRPC("BatchReserve", &err)
	results, err := runGRPCBatch(ctx, req.GetNamespace(), req.GetItems(),
		func(ctx context.Context, ns string, item *idemv1.ReserveRequest) (*idemv1.BatchReserveResult, error) {
			if item.GetWaitMs() != 0 {
				return nil, (&Error{Code: CodeInvalidArgument, Message: fmt.Sprintf(
					"wait_ms %d in a batch item: batch items never wait: send 0, or reserve this key alone to wait", item.GetWaitMs())}).GRPCStatus().Err()
			}
			one := &idemv1.ReserveRequest{Namespace: ns, Key: item.GetKey(), Fingerprint: item.GetFingerprint(),
				LeaseMs: item.GetLeaseMs(), OwnerToken: item.GetOwnerToken(), IfExpired: item.GetIfExpired()}
			resp, err := g.item(ctx, idemv1.Idempotency_Reserve_FullMethodName, one, func(ctx context.Context, req any) (any, error) {
				return g.Reserve(ctx, req.(*idemv1.ReserveRequest))
			})
			r, _ := resp.(*idemv1.ReserveResponse)
			return &idemv1.BatchReserveResult{Result: &idemv1.BatchReserveResult_Reserve{Reserve: r}}, err
		},
		func(_ *idemv1.BatchReserveResult, e *idemv1.BatchError) *idemv1.BatchReserveResult {
			return &idemv1.BatchReserveResult{Result: &idemv1.BatchReserveResult_Error{Error: e}}
		})
	if err != nil {
		return nil, err
	}
	return &idemv1.BatchReserveResponse{Results: results}, nil
}

func (g *grpcService) BatchComplete(ctx context.Context, req *idemv1.BatchCompleteRequest) (_ *idemv1.BatchCompleteResponse, err error) {
	defer g.recoverRPC("BatchComplete", &err)
	results, err := runGRPCBatch(ctx, req.GetNamespace(), req.GetItems(),
		func(ctx context.Context, ns string, item *idemv1.CompleteRequest) (*idemv1.BatchCompleteResult, error) {
			one := &idemv1.CompleteRequest{Namespace: ns, Key: item.GetKey(), OwnerToken: item.GetOwnerToken(),
				Response: item.GetResponse(), RetentionS: item.GetRetentionS()}
			resp, err := g.item(ctx, idemv1.Idempotency_Complete_FullMethodName, one, func(ctx context.Context, req any) (any, error) {
				return g.Complete(ctx, req.(*idemv1.CompleteRequest))
			})
			r, _ := resp.(*idemv1.CompleteResponse)
			return &idemv1.BatchCompleteResult{Result: &idemv1.BatchCompleteResult_Complete{Complete: r}}, err
		},
		func(_ *idemv1.BatchCompleteResult, e *idemv1.BatchError) *idemv1.BatchCompleteResult {
			return &idemv1.BatchCompleteResult{Result: &idemv1.BatchCompleteResult_Error{Error: e}}
		})
	if err != nil {
		return nil, err
	}
	return &idemv1.BatchCompleteResponse{Results: results}, nil
}
