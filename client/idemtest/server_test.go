package idemtest

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
)

// The Server is the real gRPC service, so it answers what an idemnode
// answers: the header limits of the contract, and error details that name
// the code.
func TestServesTheRealService(t *testing.T) {
	srv, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	conn, err := grpc.NewClient(srv.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := idemv1.NewIdempotencyClient(conn)
	ctx := t.Context()

	res, err := c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "k"})
	if err != nil || res.GetOutcome() != idemv1.Outcome_ACQUIRED || !contract.ValidOwnerToken(res.GetOwnerToken()) {
		t.Fatalf("reserve = %v, %v", res, err)
	}
	headers := map[string]string{}
	for i := range contract.MaxHeaders + 1 {
		headers[fmt.Sprintf("X-H%d", i)] = "v"
	}
	_, err = c.Complete(ctx, &idemv1.CompleteRequest{Namespace: "ns", Key: "k", OwnerToken: res.GetOwnerToken(),
		Response: &idemv1.StoredResponse{Status: 200, Headers: headers}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("complete with %d headers = %v, want INVALID_ARGUMENT", len(headers), err)
	}

	_, err = c.Release(ctx, &idemv1.ReleaseRequest{Namespace: "ns", Key: "k", OwnerToken: "someone-else-token-00"})
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("release by a stranger = %v, want FailedPrecondition", err)
	}
	var reason string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == contract.ErrorDomain {
			reason = info.GetReason()
		}
	}
	if reason != string(contract.CodeNotOwner) {
		t.Fatalf("NOT_OWNER carries ErrorInfo reason %q", reason)
	}

	// The clock moves with Advance: the lease runs out and another owner
	// reclaims the key.
	srv.Advance(contract.DefaultLease + DefaultSkewMargin + time.Second)
	res, err = c.Reserve(ctx, &idemv1.ReserveRequest{Namespace: "ns", Key: "k"})
	if err != nil || res.GetOutcome() != idemv1.Outcome_RECLAIMED {
		t.Fatalf("reserve after the lease = %v, %v; want RECLAIMED", res, err)
	}
}
