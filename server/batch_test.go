package server

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
)

func reserveOp(ns, key, owner string) *idemv1.BatchOp {
	return &idemv1.BatchOp{Op: &idemv1.BatchOp_Reserve{Reserve: &idemv1.ReserveRequest{Namespace: ns, Key: key, OwnerToken: owner}}}
}

// requestsMetric is idem_api_requests_total{api="grpc",endpoint,outcome}.
func requestsMetric(t *testing.T, h *harness, endpoint, outcome string) float64 {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "idem_api_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["api"] == "grpc" && labels["endpoint"] == endpoint && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestGRPCBatch: every operation of a batch is answered, in order, as its
// unary RPC answers it (the same response, or the same status: code,
// message, details), in two namespaces at once, and counted in the metrics
// as its unary RPC.
func TestGRPCBatch(t *testing.T) {
	clock := newFakeClock()
	h := newHarness(t, newMemBackend(clock), nil)
	ctx := t.Context()
	const owner = "owner-aaaaaaaaaaaaaaaa"
	if _, err := h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "shop", Key: "held", OwnerToken: owner}); err != nil {
		t.Fatal(err)
	}

	ops := []*idemv1.BatchOp{
		reserveOp("payments", "b:1", owner),
		reserveOp("shop", "b:2", owner),
		{Op: &idemv1.BatchOp_Heartbeat{Heartbeat: &idemv1.HeartbeatRequest{Namespace: "shop", Key: "held", OwnerToken: owner, LeaseMs: 5000}}},
		{Op: &idemv1.BatchOp_Complete{Complete: &idemv1.CompleteRequest{Namespace: "shop", Key: "held", OwnerToken: "someone-else-0000000", Response: &idemv1.StoredResponse{Status: 200}}}},
		{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "payments", Key: "never"}}},
		reserveOp("Not A Namespace!", "b:3", ""),
		{Op: &idemv1.BatchOp_Release{Release: &idemv1.ReleaseRequest{Namespace: "shop", Key: "b:2", OwnerToken: owner}}},
		{}, // names no operation
	}
	resp, err := h.grpc.Batch(ctx, &idemv1.BatchRequest{Ops: ops})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if len(res) != len(ops) {
		t.Fatalf("%d results for %d operations", len(res), len(ops))
	}
	if r := res[0].GetReserve(); r.GetOutcome() != idemv1.Outcome_ACQUIRED || r.GetOwnerToken() != owner || r.GetFencingToken() == 0 {
		t.Fatalf("op 0 reserve: %v", res[0])
	}
	if r := res[1].GetReserve(); r.GetOutcome() != idemv1.Outcome_ACQUIRED || r.GetOwnerToken() != owner {
		t.Fatalf("op 1 reserve in another namespace: %v", res[1])
	}
	if hb := res[2].GetHeartbeat(); hb.GetLeaseExpiresAt().AsTime().UnixNano() != clock.Now()+int64(5*time.Second) {
		t.Fatalf("op 2 heartbeat: %v", res[2])
	}
	// The release of op 6 ran concurrently with the reserve of op 1: it
	// either freed the key or found it not reserved yet (NOT_OWNER).
	if res[6].GetRelease() == nil {
		expectStatus(t, idemv1.BatchErrorStatus(res[6].GetError()).Err(), codes.FailedPrecondition, CodeNotOwner)
	}

	// Errors: exactly the unary RPC's status.
	unary := []struct {
		i    int
		call func() error
		code codes.Code
		why  Code
	}{
		{3, func() error { _, err := h.grpc.Complete(ctx, ops[3].GetComplete()); return err }, codes.FailedPrecondition, CodeNotOwner},
		{4, func() error { _, err := h.grpc.Get(ctx, ops[4].GetGet()); return err }, codes.NotFound, CodeNotFound},
		{5, func() error { _, err := h.grpc.Reserve(ctx, ops[5].GetReserve()); return err }, codes.InvalidArgument, CodeInvalidArgument},
	}
	for _, u := range unary {
		got := idemv1.BatchErrorStatus(res[u.i].GetError())
		expectStatus(t, got.Err(), u.code, u.why)
		want := status.Convert(u.call())
		if !proto.Equal(got.Proto(), want.Proto()) {
			t.Fatalf("op %d: batch status %v, unary status %v", u.i, got.Proto(), want.Proto())
		}
	}
	expectStatus(t, idemv1.BatchErrorStatus(res[7].GetError()).Err(), codes.InvalidArgument, CodeInvalidArgument)

	// Metrics: per operation, with the unary RPC's labels (the unary calls
	// above added one each), and the batch once.
	for _, m := range []struct {
		endpoint, outcome string
		want              float64
	}{
		{"reserve", "ACQUIRED", 3}, // "held" before the batch, and ops 0, 1
		{"heartbeat", "OK", 1},
		{"complete", "NOT_OWNER", 2},
		{"get", "NOT_FOUND", 2},
		{"reserve", "INVALID_ARGUMENT", 2},
		{"batch", "OK", 1},
	} {
		if got := requestsMetric(t, h, m.endpoint, m.outcome); got != m.want {
			t.Errorf("idem_api_requests_total{endpoint=%q,outcome=%q} = %v, want %v", m.endpoint, m.outcome, got, m.want)
		}
	}
}

// TestGRPCBatchConcurrent: the operations of a batch run concurrently: a
// waiting reserve is woken by the complete that comes after it in the same
// batch (run one after the other, the reserve would wait its 20 s out and
// answer IN_PROGRESS).
func TestGRPCBatchConcurrent(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	ctx := t.Context()
	const owner = "owner-aaaaaaaaaaaaaaaa"
	if _, err := h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "pay", Key: "k", OwnerToken: owner}); err != nil {
		t.Fatal(err)
	}
	resp, err := h.grpc.Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{
		{Op: &idemv1.BatchOp_Reserve{Reserve: &idemv1.ReserveRequest{Namespace: "pay", Key: "k", WaitMs: 20000}}},
		{Op: &idemv1.BatchOp_Complete{Complete: &idemv1.CompleteRequest{Namespace: "pay", Key: "k", OwnerToken: owner, Response: &idemv1.StoredResponse{Status: 201, Body: []byte("ok")}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.GetResults()[0].GetReserve(); r.GetOutcome() != idemv1.Outcome_COMPLETED || string(r.GetResponse().GetBody()) != "ok" {
		t.Fatalf("waiting reserve: %v", resp.GetResults()[0])
	}
	if resp.GetResults()[1].GetComplete() == nil {
		t.Fatalf("complete: %v", resp.GetResults()[1])
	}
}

// TestGRPCBatchLimits: more than MaxBatchOps operations is INVALID_ARGUMENT
// and more than MaxBatchBytes PAYLOAD_TOO_LARGE, whatever the node's own
// message limit; an empty batch has no results.
func TestGRPCBatchLimits(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), func(c *Config) { c.MaxResponseBytes = 8 << 20 })
	ctx := t.Context()
	ops := make([]*idemv1.BatchOp, idemv1.MaxBatchOps+1)
	for i := range ops {
		ops[i] = reserveOp("pay", "k", "")
	}
	_, err := h.grpc.Batch(ctx, &idemv1.BatchRequest{Ops: ops})
	expectStatus(t, err, codes.InvalidArgument, CodeInvalidArgument)
	if _, err := h.grpc.Get(ctx, &idemv1.GetRequest{Namespace: "pay", Key: "k"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused batch applied an operation: %v", err)
	}

	body := bytes.Repeat([]byte("x"), 3<<20)
	big := func(key string) *idemv1.BatchOp {
		return &idemv1.BatchOp{Op: &idemv1.BatchOp_Complete{Complete: &idemv1.CompleteRequest{Namespace: "pay", Key: key, OwnerToken: "owner-aaaaaaaaaaaaaaaa", Response: &idemv1.StoredResponse{Status: 200, Body: body}}}}
	}
	_, err = h.grpc.Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{big("a"), big("b")}})
	expectStatus(t, err, codes.ResourceExhausted, CodePayloadTooLarge)

	resp, err := h.grpc.Batch(ctx, &idemv1.BatchRequest{})
	if err != nil || len(resp.GetResults()) != 0 {
		t.Fatalf("empty batch: %v %v", resp, err)
	}
}

// TestGRPCBatchWithholdsLarge: a response that would exceed MaxBatchBytes
// withholds results of operations that change nothing (gets of large
// stored responses), never those of operations that change the store.
func TestGRPCBatchWithholdsLarge(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), func(c *Config) { c.MaxResponseBytes = 8 << 20 })
	ctx := t.Context()
	const owner = "owner-aaaaaaaaaaaaaaaa"
	body := bytes.Repeat([]byte("y"), 2<<20)
	var ops []*idemv1.BatchOp
	for _, k := range []string{"a", "b", "c"} {
		if _, err := h.grpc.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "pay", Key: k, OwnerToken: owner}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.grpc.Complete(ctx, &idemv1.CompleteRequest{Namespace: "pay", Key: k, OwnerToken: owner, Response: &idemv1.StoredResponse{Status: 200, Body: body}}); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, &idemv1.BatchOp{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "pay", Key: k}}})
	}
	ops = append(ops, reserveOp("pay", "fresh", owner))
	resp, err := h.grpc.Batch(ctx, &idemv1.BatchRequest{Ops: ops})
	if err != nil {
		t.Fatal(err)
	}
	if n := proto.Size(resp); n > idemv1.MaxBatchBytes {
		t.Fatalf("response of %d bytes, more than %d", n, idemv1.MaxBatchBytes)
	}
	withheld, full := 0, 0
	for _, r := range resp.GetResults()[:3] {
		switch {
		case r.GetWithheld() && r.GetResult() == nil:
			withheld++
		case bytes.Equal(r.GetGet().GetResponse().GetBody(), body):
			full++
		default:
			t.Fatalf("get result neither whole nor withheld: withheld=%v", r.GetWithheld())
		}
	}
	if withheld != 2 || full != 1 {
		t.Fatalf("%d withheld, %d whole; want 2 and 1 (one 2 MiB body fits in 4 MiB)", withheld, full)
	}
	if r := resp.GetResults()[3]; r.GetWithheld() || r.GetReserve().GetOutcome() != idemv1.Outcome_ACQUIRED {
		t.Fatalf("reserve: %v", r)
	}
}

// TestGRPCBatchLeader: each operation carries its own leader hint, and a
// follower's refusal is the unary RPC's UNAVAILABLE with the leader named.
func TestGRPCBatchLeader(t *testing.T) {
	b := &routedBackend{Mem: newMemBackend(newFakeClock())}
	h := newHarness(t, b, nil)
	op := reserveOp("ns", "k", "")
	resp, err := h.grpc.Batch(t.Context(), &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{op}})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.GetResults()[0]; r.GetLeaderId() != "node-3" || r.GetReserve() == nil {
		t.Fatalf("leader result: %v", r)
	}
	b.follower = true
	resp, err = h.grpc.Batch(t.Context(), &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{op}})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetResults()[0]
	expectStatus(t, idemv1.BatchErrorStatus(r.GetError()).Err(), idemv1.GRPCCode(CodeUnavailable), CodeUnavailable)
	if r.GetLeaderId() != "node-7" {
		t.Fatalf("follower's leader hint %q, want node-7", r.GetLeaderId())
	}
}
