package server

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/security/auth"
)

// TestGRPCBatchAuthorization serves the API with the Authorizer's
// interceptor after the server's own, as a node does: the batch needs a
// known caller and is charged its operation count at once; each operation
// is then authorized (role, namespace) as its unary RPC, with the
// connection's principal.
func TestGRPCBatchAuthorization(t *testing.T) {
	hash := func(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }
	file := filepath.Join(t.TempDir(), "auth.yaml")
	body := fmt.Sprintf(`principals:
  - name: billing-api
    token_sha256: %s
    namespaces: [billing]
    role: writer
    rate_per_s: 2
  - name: auditor
    token_sha256: %s
    namespaces: ["*"]
    role: reader
`, hash("tok-billing"), hash("tok-auditor"))
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	frozen := time.Unix(1_800_000_000, 0)
	a, err := auth.New(auth.Config{File: file, Now: func() time.Time { return frozen }})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Backend = newMemBackend(newFakeClock())
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gs := srv.NewGRPCServer(grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor(nil)))
	lis := listenLoopback(t)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	api := idemv1.NewIdempotencyClient(conn)
	withToken := func(tok string) metadata.MD { return metadata.Pairs("authorization", "Bearer "+tok) }

	// No credentials: the batch is refused as a whole.
	_, err = api.Batch(t.Context(), &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{reserveOp("billing", "k", "")}})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("anonymous batch: %v, want Unauthenticated", err)
	}

	// A writer on billing with a burst of 2: a batch of four operations
	// is over what the bucket can ever pay at once, and is refused whole
	// (429 with a retry hint) before any operation runs.
	ctx := metadata.NewOutgoingContext(t.Context(), withToken("tok-billing"))
	_, err = api.Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{
		reserveOp("billing", "a", ""), reserveOp("shop", "b", ""), reserveOp("billing", "c", ""),
		{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "billing", Key: "d"}}},
	}})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted {
		t.Fatalf("batch of 4 over a burst of 2: %v, want ResourceExhausted", err)
	} else if _, _, retry := idemv1.StatusToError(st); retry <= 0 {
		t.Fatalf("refused batch without a retry hint: %v", st.Proto())
	}
	// Two operations are paid at once, the one on another namespace
	// too: it is denied, and its token is spent.
	resp, err := api.Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{reserveOp("billing", "a", ""), reserveOp("shop", "b", "")}})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if res[0].GetReserve().GetOutcome() != idemv1.Outcome_ACQUIRED {
		t.Fatalf("billing operation: %v", res[0])
	}
	if c := idemv1.BatchErrorStatus(res[1].GetError()).Code(); c != codes.PermissionDenied {
		t.Fatalf("operation on another namespace: %v, want PermissionDenied", res[1])
	}
	// The bucket is empty (the clock is frozen): the next batch, and the
	// next unary RPC, are refused.
	if _, err := api.Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{reserveOp("billing", "z", "")}}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("batch after the bucket emptied: %v, want ResourceExhausted", err)
	}
	if _, err := api.Get(ctx, &idemv1.GetRequest{Namespace: "billing", Key: "d"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("unary get after the batch: %v, want ResourceExhausted", err)
	}

	// A reader may get but not reserve, in any namespace.
	ctx = metadata.NewOutgoingContext(t.Context(), withToken("tok-auditor"))
	resp, err = api.Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{
		{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "billing", Key: "a"}}},
		reserveOp("billing", "e", ""),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if g := resp.GetResults()[0].GetGet(); g == nil && status.Code(idemv1.BatchErrorStatus(resp.GetResults()[0].GetError()).Err()) != codes.NotFound {
		t.Fatalf("reader's get: %v", resp.GetResults()[0])
	}
	if c := idemv1.BatchErrorStatus(resp.GetResults()[1].GetError()).Code(); c != codes.PermissionDenied {
		t.Fatalf("reader's reserve: %v, want PermissionDenied", resp.GetResults()[1])
	}
	// The denial is the unary RPC's, status for status.
	_, unaryErr := api.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "billing", Key: "e"})
	if got, want := idemv1.BatchErrorStatus(resp.GetResults()[1].GetError()).Proto(), status.Convert(unaryErr).Proto(); !proto.Equal(got, want) {
		t.Fatalf("batch denial %v, unary denial %v", got, want)
	}
}

// TestBatchCallsChargeEachItem: a BatchReserve or keys:batch-reserve of N
// items is charged N against the principal's rate, as N single calls, all
// at once and before any item is validated (invalid items pay too): with a
// burst of 3 and a frozen clock, a batch of more than 3 is refused whole
// (429 / RESOURCE_EXHAUSTED), one of 3 takes the whole bucket, and the
// next call of either kind is refused.
func TestBatchCallsChargeEachItem(t *testing.T) {
	hash := func(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }
	file := filepath.Join(t.TempDir(), "auth.yaml")
	body := fmt.Sprintf(`principals:
  - name: grpc-user
    token_sha256: %s
    namespaces: [billing]
    role: writer
    rate_per_s: 3
  - name: json-user
    token_sha256: %s
    namespaces: [billing]
    role: writer
    rate_per_s: 3
`, hash("tok-grpc"), hash("tok-json"))
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	frozen := time.Unix(1_800_000_000, 0)
	a, err := auth.New(auth.Config{File: file, Now: func() time.Time { return frozen }})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Backend = newMemBackend(newFakeClock())
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// gRPC: a batch of three items (invalid ones too) takes the whole
	// burst of 3, before any item is validated.
	gs := srv.NewGRPCServer(grpc.ChainUnaryInterceptor(a.UnaryServerInterceptor(nil)))
	lis := listenLoopback(t)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	api := idemv1.NewIdempotencyClient(conn)
	ctx := metadata.NewOutgoingContext(t.Context(), metadata.Pairs("authorization", "Bearer tok-grpc"))
	items := make([]*idemv1.ReserveRequest, 5)
	for i := range items {
		items[i] = &idemv1.ReserveRequest{Key: fmt.Sprintf("g%d", i), OwnerToken: fmt.Sprintf("owner-token-%010d", i)}
	}
	if _, err := api.BatchReserve(ctx, &idemv1.BatchReserveRequest{Namespace: "billing", Items: items}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC batch of 5 over a burst of 3: %v, want ResourceExhausted for the whole call", err)
	}
	invalid := []*idemv1.ReserveRequest{items[0], {Key: ""}, {Key: "g9", LeaseMs: -1}}
	resp, err := api.BatchReserve(ctx, &idemv1.BatchReserveRequest{Namespace: "billing", Items: invalid})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.GetResults(); r[0].GetReserve().GetOutcome() != idemv1.Outcome_ACQUIRED || r[1].GetError() == nil || r[2].GetError() == nil {
		t.Fatalf("gRPC batch of one valid and two invalid items: %v", r)
	}
	if _, err := api.BatchReserve(ctx, &idemv1.BatchReserveRequest{Namespace: "billing", Items: items[1:2]}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("gRPC batch after the bucket emptied: %v, want ResourceExhausted", err)
	}
	if _, err := api.Get(ctx, &idemv1.GetRequest{Namespace: "billing", Key: "g0"}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("unary get after the batch: %v, want ResourceExhausted", err)
	}
	// A batch in a namespace the principal may not use is refused whole,
	// before any item runs.
	_, err = api.BatchReserve(ctx, &idemv1.BatchReserveRequest{Namespace: "shop", Items: items[:1]})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("batch in another namespace: %v, want PermissionDenied", err)
	}

	// JSON: four items, three pass.
	hs := httptest.NewServer(a.Middleware(srv.HTTPHandler(), auth.JSONAPITarget, nil))
	t.Cleanup(hs.Close)
	post := func(path, body string) (int, []byte) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, hs.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer tok-json")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	// JSON: four items are over the burst of 3: 429 for the whole call;
	// three, two of them invalid, take the whole burst.
	code, out := post("/v1/namespaces/billing/keys:batch-reserve", `{"items": [{"key": "j0"}, {"key": "j1"}, {"key": "j2"}, {"key": "j3"}]}`)
	if code != http.StatusTooManyRequests {
		t.Fatalf("JSON batch of 4 over a burst of 3: %d %s, want 429", code, out)
	}
	code, out = post("/v1/namespaces/billing/keys:batch-reserve", `{"items": [{"key": "j0"}, {"key": ""}, {"lease_ms": "x"}]}`)
	if code != http.StatusOK {
		t.Fatalf("JSON batch: %d %s", code, out)
	}
	var got struct {
		Results []struct {
			Outcome string `json:"outcome"`
			Error   struct {
				Code string `json:"code"`
			} `json:"error"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Results) != 3 || got.Results[0].Outcome != "ACQUIRED" || got.Results[1].Error.Code != "INVALID_ARGUMENT" || got.Results[2].Error.Code != "INVALID_ARGUMENT" {
		t.Fatalf("JSON batch of one valid and two invalid items: %s", out)
	}
	if code, out := post("/v1/namespaces/billing/keys:batch-reserve", `{"items": [{"key": "j5"}]}`); code != http.StatusTooManyRequests {
		t.Fatalf("JSON batch after the bucket emptied: %d %s, want 429", code, out)
	}
	if code, out := post("/v1/namespaces/billing/keys/j9:reserve", `{}`); code != http.StatusTooManyRequests {
		t.Fatalf("single reserve after the batch: %d %s, want 429", code, out)
	}
}
