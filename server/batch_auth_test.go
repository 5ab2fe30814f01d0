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
// known caller; each operation is authorized (role, namespace) and charged
// to the rate as its unary RPC, with the connection's principal.
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

	// A writer on billing with a burst of 2: of three billing operations
	// exactly two pass (they run concurrently, so which one is refused is
	// not fixed), the batch itself took no token, and the shop operation
	// is denied without spending one.
	ctx := metadata.NewOutgoingContext(t.Context(), withToken("tok-billing"))
	resp, err := api.Batch(ctx, &idemv1.BatchRequest{Ops: []*idemv1.BatchOp{
		reserveOp("billing", "a", ""),
		reserveOp("shop", "b", ""),
		reserveOp("billing", "c", ""),
		{Op: &idemv1.BatchOp_Get{Get: &idemv1.GetRequest{Namespace: "billing", Key: "d"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if c := idemv1.BatchErrorStatus(res[1].GetError()).Code(); c != codes.PermissionDenied {
		t.Fatalf("operation on another namespace: %v, want PermissionDenied", res[1])
	}
	passed, limited := 0, 0
	for _, i := range []int{0, 2, 3} {
		st := idemv1.BatchErrorStatus(res[i].GetError())
		switch {
		case res[i].GetReserve().GetOutcome() == idemv1.Outcome_ACQUIRED, st.Code() == codes.NotFound:
			passed++
		case st.Code() == codes.ResourceExhausted:
			limited++
			if _, _, retry := idemv1.StatusToError(st); retry <= 0 {
				t.Fatalf("rate-limited operation without a retry hint: %v", st.Proto())
			}
		default:
			t.Fatalf("operation %d: %v", i, res[i])
		}
	}
	if passed != 2 || limited != 1 {
		t.Fatalf("%d operations passed and %d were rate-limited; want 2 and 1 (burst 2, the batch itself free)", passed, limited)
	}
	// The bucket is empty (the clock is frozen): the next unary RPC too is
	// refused, so the batch's operations were charged as unary RPCs.
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
// items is charged N against the principal's rate, as N single calls: with
// a burst of 3 and a frozen clock, three items pass, the others are refused
// RESOURCE_EXHAUSTED alone, and the next call of either kind is refused.
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

	// gRPC: five items, three pass.
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
	resp, err := api.BatchReserve(ctx, &idemv1.BatchReserveRequest{Namespace: "billing", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	passed, limited := 0, 0
	for i, r := range resp.GetResults() {
		switch {
		case r.GetReserve().GetOutcome() == idemv1.Outcome_ACQUIRED:
			passed++
		case idemv1.BatchErrorStatus(r.GetError()).Code() == codes.ResourceExhausted:
			limited++
		default:
			t.Fatalf("item %d: %v", i, r)
		}
	}
	if passed != 3 || limited != 2 {
		t.Fatalf("gRPC batch of 5 with a burst of 3: %d passed, %d rate-limited", passed, limited)
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
	code, out := post("/v1/namespaces/billing/keys:batch-reserve", `{"items": [{"key": "j0"}, {"key": "j1"}, {"key": "j2"}, {"key": "j3"}]}`)
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
	passed, limited = 0, 0
	for i, r := range got.Results {
		switch {
		case r.Outcome == "ACQUIRED":
			passed++
		case r.Error.Code == "RESOURCE_EXHAUSTED":
			limited++
		default:
			t.Fatalf("JSON item %d: %s", i, out)
		}
	}
	if passed != 3 || limited != 1 {
		t.Fatalf("JSON batch of 4 with a burst of 3: %d passed, %d rate-limited: %s", passed, limited, out)
	}
	if code, out := post("/v1/namespaces/billing/keys/j9:reserve", `{}`); code != http.StatusTooManyRequests {
		t.Fatalf("single reserve after the batch: %d %s, want 429", code, out)
	}
}
