package client_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// deadlineNode answers Complete and BatchComplete and records, per call, how
// much time the caller's deadline left it when the call arrived.
type deadlineNode struct {
	idemv1.UnimplementedIdempotencyServer
	mu   sync.Mutex
	left []time.Duration
}

func (d *deadlineNode) record(ctx context.Context) error {
	dl, ok := ctx.Deadline()
	if !ok {
		return status.Error(codes.InvalidArgument, "the call came without a deadline")
	}
	d.mu.Lock()
	d.left = append(d.left, time.Until(dl))
	d.mu.Unlock()
	return nil
}

func (d *deadlineNode) last(t *testing.T) time.Duration {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.left) == 0 {
		t.Fatal("the node recorded no call")
	}
	return d.left[len(d.left)-1]
}

func (d *deadlineNode) Complete(ctx context.Context, _ *idemv1.CompleteRequest) (*idemv1.CompleteResponse, error) {
	if err := d.record(ctx); err != nil {
		return nil, err
	}
	return &idemv1.CompleteResponse{}, nil
}

func (d *deadlineNode) BatchComplete(ctx context.Context, req *idemv1.BatchCompleteRequest) (*idemv1.BatchCompleteResponse, error) {
	if err := d.record(ctx); err != nil {
		return nil, err
	}
	resp := &idemv1.BatchCompleteResponse{Results: make([]*idemv1.BatchCompleteResult, len(req.GetItems()))}
	for i := range resp.Results {
		resp.Results[i] = &idemv1.BatchCompleteResult{Result: &idemv1.BatchCompleteResult_Complete{Complete: &idemv1.CompleteResponse{}}}
	}
	return resp, nil
}

// TestAttemptTimeoutGrowsWithPayload: an attempt carrying a large completion
// gets a second per MiB on top of RequestTimeout, as a node forwarding it
// does, so that a region slow to write megabytes to a majority is not cut
// off (and sent the megabytes again) at a small command's budget. A small
// completion keeps the plain RequestTimeout.
func TestAttemptTimeoutGrowsWithPayload(t *testing.T) {
	node := &deadlineNode{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(16 << 20))
	idemv1.RegisterIdempotencyServer(gs, node)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	const timeout = 300 * time.Millisecond
	c := newClient(t, []string{lis.Addr().String()}, func(cfg *client.Config) {
		cfg.RequestTimeout = timeout
		cfg.DisableRouting = true
	})
	ctx := t.Context()
	complete := func(key string, body int) client.CompleteRequest {
		return client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: "owner-token-0123456789-" + key,
			Response: client.Response{Status: 200, Body: []byte(strings.Repeat("x", body))}}
	}

	if _, err := c.Complete(ctx, complete("small", 100)); err != nil {
		t.Fatal(err)
	}
	if left := node.last(t); left > timeout+time.Millisecond {
		t.Errorf("a 100-byte completion's attempt had %v left, more than the %v request timeout", left, timeout)
	}

	if _, err := c.Complete(ctx, complete("large", 3<<20)); err != nil {
		t.Fatal(err)
	}
	// Without the allowance the attempt has the request timeout at most;
	// with it, ~3 s more, less however long 3 MiB took to arrive on a
	// loaded box (PayloadAllowance's size has its own test in forward).
	if left := node.last(t); left <= timeout {
		t.Errorf("a 3 MiB completion's attempt had %v left: want the %v request timeout plus ~3 s for its payload", left, timeout)
	}

	// A batch's chunk gets the allowance of everything it carries.
	for _, r := range c.CompleteMany(ctx, ns, []client.CompleteRequest{complete("b1", 1<<20), complete("b2", 1<<20)}) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if left := node.last(t); left <= timeout {
		t.Errorf("a batch of two 1 MiB completions had %v left: want the %v request timeout plus ~2 s for its payload", left, timeout)
	}
}
