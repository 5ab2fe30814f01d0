package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Batch calls: ReserveMany and CompleteMany send many keys of one namespace
// in few BatchReserve / BatchComplete RPCs. A batch goes to any endpoint
// (round-robin, not to a shard's leader): the node that receives it fans the
// items out to the leaders of their shards, so one batch may carry keys of
// every shard. Each item is answered exactly as its single call would be.
const (
	// MaxBatchItems is the most items one batch RPC carries (the contract's
	// bound); longer lists are split into several RPCs.
	MaxBatchItems = 1000
	// maxBatchBytes bounds the encoded items of one batch RPC, below gRPC's
	// default 4 MiB message limit: completes with large responses are split.
	maxBatchBytes = 3 << 20
)

// ReserveResult is the answer to one item of ReserveMany: the Reservation
// the single Reserve would have returned, or its error.
type ReserveResult struct {
	Reservation
	Err error
}

// CompleteResult is the answer to one item of CompleteMany.
type CompleteResult struct {
	Completion
	Err error
}

// ReserveMany reserves every item of reqs in namespace (an item's Namespace
// is empty or namespace) with BatchReserve RPCs, and returns one result per
// item, in order. Items are independent: an invalid or refused item fails
// alone, with the error the single Reserve would have returned. An item
// with an empty OwnerToken gets a new one (in its Reservation, error or
// not), kept across retries. A batch reserve does not wait for other
// owners: an item's Wait must be zero. Items naming the same key are
// applied in item order when one RPC carries them (up to MaxBatchItems
// items and 3 MiB) and none is retried; OnceBatch sends each key once.
//
// Retries: a batch whose RPC fails without an answer is sent again to the
// next endpoint, and items answered with a retryable error (UNAVAILABLE:
// their shard was changing leaders) are sent again in a next batch, up to
// Config.MaxAttempts in all, with backoff. A node without the batch calls
// (UNIMPLEMENTED, older than v1.2) gets each item as a single Reserve.
func (c *Client) ReserveMany(ctx context.Context, namespace string, reqs []ReserveRequest) []ReserveResult {
	results := make([]ReserveResult, len(reqs))
	pbs := make([]*idemv1.ReserveRequest, len(reqs))
	items := make([]ReserveRequest, len(reqs))
	var pending []int
	for i, req := range reqs {
		err := itemNamespace(&req.Namespace, namespace)
		if req.Wait != 0 {
			err = errors.Join(err, invalid("wait is %v: a batch reserve does not wait, send the item alone with Reserve", req.Wait))
		}
		pb, perr := reserveProto(req)
		items[i], pbs[i] = req, pb
		results[i].OwnerToken = pb.GetOwnerToken()
		if err = errors.Join(err, perr); err != nil {
			results[i].Err = fmt.Errorf("reserve %s/%s: %w", namespace, req.Key, err)
			continue
		}
		pending = append(pending, i)
	}
	c.many(ctx, "batch reserve "+namespace, namespace, pending,
		func(i int) int { return proto.Size(pbs[i]) },
		func(ctx context.Context, stub idemv1.IdempotencyClient, idx []int, opts ...grpc.CallOption) ([]*status.Status, error) {
			req := &idemv1.BatchReserveRequest{Namespace: namespace, Items: make([]*idemv1.ReserveRequest, len(idx))}
			for j, i := range idx {
				req.Items[j] = pbs[i]
			}
			resp, err := stub.BatchReserve(ctx, req, opts...)
			if err != nil {
				return nil, err
			}
			return itemStatuses(resp.GetResults(), idx, func(i int, r *idemv1.BatchReserveResult) bool {
				if r.GetReserve() == nil {
					return false
				}
				res, err := reservationFromProto(items[i], pbs[i].OwnerToken, r.GetReserve())
				results[i] = ReserveResult{Reservation: res, Err: err}
				return true
			})
		},
		func(ctx context.Context, i int) {
			res, err := c.Reserve(ctx, items[i])
			results[i] = ReserveResult{Reservation: res, Err: err}
		},
		func(i int, err error) {
			results[i] = ReserveResult{Reservation: Reservation{OwnerToken: pbs[i].OwnerToken}, Err: err}
		})
	return results
}

// CompleteMany completes every item of reqs in namespace (an item's
// Namespace is empty or namespace) with BatchComplete RPCs, and returns one
// result per item, in order, each what the single Complete would have
// returned. Retries and older nodes are handled as in ReserveMany; a
// complete is safe to repeat.
func (c *Client) CompleteMany(ctx context.Context, namespace string, reqs []CompleteRequest) []CompleteResult {
	results := make([]CompleteResult, len(reqs))
	pbs := make([]*idemv1.CompleteRequest, len(reqs))
	items := make([]CompleteRequest, len(reqs))
	var pending []int
	for i, req := range reqs {
		err := itemNamespace(&req.Namespace, namespace)
		pb, perr := completeProto(req)
		items[i], pbs[i] = req, pb
		if err = errors.Join(err, perr); err != nil {
			results[i].Err = fmt.Errorf("complete %s/%s: %w", namespace, req.Key, err)
			continue
		}
		pending = append(pending, i)
	}
	c.many(ctx, "batch complete "+namespace, namespace, pending,
		func(i int) int { return proto.Size(pbs[i]) },
		func(ctx context.Context, stub idemv1.IdempotencyClient, idx []int, opts ...grpc.CallOption) ([]*status.Status, error) {
			req := &idemv1.BatchCompleteRequest{Namespace: namespace, Items: make([]*idemv1.CompleteRequest, len(idx))}
			for j, i := range idx {
				req.Items[j] = pbs[i]
			}
			resp, err := stub.BatchComplete(ctx, req, opts...)
			if err != nil {
				return nil, err
			}
			return itemStatuses(resp.GetResults(), idx, func(i int, r *idemv1.BatchCompleteResult) bool {
				if r.GetComplete() == nil {
					return false
				}
				results[i] = CompleteResult{Completion: Completion{
					CompletedAt: timeFromProto(r.GetComplete().GetCompletedAt()),
					ExpiresAt:   timeFromProto(r.GetComplete().GetExpiresAt()),
				}}
				return true
			})
		},
		func(ctx context.Context, i int) {
			comp, err := c.Complete(ctx, items[i])
			results[i] = CompleteResult{Completion: comp, Err: err}
		},
		func(i int, err error) { results[i] = CompleteResult{Err: err} })
	return results
}

// itemNamespace sets an item's empty namespace to the batch's, or is the
// error of an item of another namespace.
func itemNamespace(item *string, namespace string) error {
	if *item == "" {
		*item = namespace
		return nil
	}
	if *item != namespace {
		return invalid("the item's namespace %q differs from the batch's %q: a batch is one namespace", *item, namespace)
	}
	return nil
}

// itemStatuses reads the results of the items idx: ok records item i's
// result and reports whether it had one; otherwise the item's status is its
// error (an item answered with neither is a failure of the store).
func itemStatuses[R interface{ GetError() *idemv1.BatchError }](results []R, idx []int, ok func(i int, r R) bool) ([]*status.Status, error) {
	if len(results) != len(idx) {
		return nil, fmt.Errorf("the store answered %d results for %d items", len(results), len(idx))
	}
	sts := make([]*status.Status, len(idx))
	for j, i := range idx {
		switch e := results[j].GetError(); {
		case e != nil:
			sts[j] = idemv1.BatchErrorStatus(e)
		case !ok(i, results[j]):
			sts[j] = status.New(codes.Internal, "the store answered the item with neither a result nor an error")
		}
	}
	return sts, nil
}

// batchSend sends the items idx as one batch RPC on stub. It records each
// item's result itself and returns, per item, nil or the item's error.
type batchSend func(ctx context.Context, stub idemv1.IdempotencyClient, idx []int, opts ...grpc.CallOption) ([]*status.Status, error)

// many runs a batch call over the items pending: in chunks of at most
// MaxBatchItems items and maxBatchBytes (by size), concurrently, each chunk
// with invoke's retries and an attempt timeout grown by the chunk's size
// (payloadAllowance); items answered with a retryable error go again in
// the next round, up to MaxAttempts rounds. fail records an item's error;
// single runs one item as its single call, when the node does not know the
// batch call.
func (c *Client) many(ctx context.Context, op, namespace string, pending []int, size func(int) int, send batchSend,
	single func(ctx context.Context, i int), fail func(i int, err error)) {
	for round := 1; len(pending) > 0; round++ {
		var mu sync.Mutex
		var next []int
		var wg sync.WaitGroup
		for _, ch := range chunkItems(pending, size) {
			chunk := ch.idx
			wg.Go(func() {
				var sts []*status.Status
				_, err := c.invokeWaiting(ctx, fmt.Sprintf("%s (%d items)", op, len(chunk)), namespace, "", payloadAllowance(ch.bytes), func(ctx context.Context, stub idemv1.IdempotencyClient, opts ...grpc.CallOption) (err error) {
					sts, err = send(ctx, stub, chunk, opts...)
					return err
				})
				if status.Code(err) == codes.Unimplemented {
					c.log.Debug("the node does not know the batch calls; sending the items one by one", "op", op, "items", len(chunk))
					var iwg sync.WaitGroup
					for _, i := range chunk {
						iwg.Go(func() { single(ctx, i) })
					}
					iwg.Wait()
					return
				}
				if err != nil {
					for _, i := range chunk {
						fail(i, err)
					}
					return
				}
				for j, i := range chunk {
					st := sts[j]
					switch {
					case st == nil:
					case retryable(st.Err()) && round < c.cfg.MaxAttempts:
						mu.Lock()
						next = append(next, i)
						mu.Unlock()
					case retryable(st.Err()):
						fail(i, fmt.Errorf("%w: %s: item %d failed %d attempts: %w", ErrUnavailable, op, i, round, st.Err()))
					default:
						fail(i, mapError(fmt.Sprintf("%s: item %d", op, i), st.Err()))
					}
				}
			})
		}
		wg.Wait()
		pending = next
		if len(pending) == 0 {
			return
		}
		t := time.NewTimer(c.backoff(round))
		select {
		case <-ctx.Done():
			t.Stop()
			for _, i := range pending {
				fail(i, fmt.Errorf("client: %s: item %d: %w (it was answered UNAVAILABLE)", op, i, context.Cause(ctx)))
			}
			return
		case <-t.C:
		}
	}
}

// itemChunk is a run of items for one batch RPC and their encoded size.
type itemChunk struct {
	idx   []int
	bytes int
}

// chunkItems splits idx into runs of at most MaxBatchItems items whose
// sizes add up to at most maxBatchBytes (a larger item goes alone).
func chunkItems(idx []int, size func(int) int) []itemChunk {
	var chunks []itemChunk
	start, bytes := 0, 0
	for k, i := range idx {
		n := size(i)
		if k > start && (k-start == MaxBatchItems || bytes+n > maxBatchBytes) {
			chunks = append(chunks, itemChunk{idx[start:k], bytes})
			start, bytes = k, 0
		}
		bytes += n
	}
	if start < len(idx) {
		chunks = append(chunks, itemChunk{idx[start:], bytes})
	}
	return chunks
}
