package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
)

// TestReserveManyCompleteMany: each item of a batch is answered as its
// single call would be, in order, and a bad item fails alone.
func TestReserveManyCompleteMany(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()}, noRouting)
	ctx := t.Context()

	held, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "held"})
	if err != nil {
		t.Fatal(err)
	}
	res := c.ReserveMany(ctx, ns, []client.ReserveRequest{
		{Key: "a", Fingerprint: "fa"},
		{Key: "bad key"},
		{Namespace: ns, Key: "b", OwnerToken: "owner-token-of-b-0001"},
		{Key: "held"},
		{Namespace: "other", Key: "c"},
		{Key: "d", Wait: 1},
	})
	if len(res) != 6 {
		t.Fatalf("%d results for 6 items", len(res))
	}
	for _, i := range []int{0, 2} {
		if res[i].Err != nil || res[i].Outcome != client.OutcomeAcquired || res[i].FencingToken == 0 || res[i].OwnerToken == "" {
			t.Fatalf("item %d: %+v", i, res[i])
		}
	}
	if res[2].OwnerToken != "owner-token-of-b-0001" {
		t.Fatalf("item 2 reserved with token %q, not the one it named", res[2].OwnerToken)
	}
	for _, i := range []int{1, 4, 5} {
		if !errors.Is(res[i].Err, client.ErrInvalidArgument) {
			t.Fatalf("item %d: %v, want ErrInvalidArgument", i, res[i].Err)
		}
	}
	if res[3].Err != nil || res[3].Outcome != client.OutcomeInProgress {
		t.Fatalf("held item: %+v, want IN_PROGRESS", res[3])
	}
	// A reserve of the same key by the same token is the same reservation,
	// as the single call answers it.
	again, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "a", Fingerprint: "fa", OwnerToken: res[0].OwnerToken})
	if err != nil || again.Outcome != client.OutcomeAcquired || again.FencingToken != res[0].FencingToken {
		t.Fatalf("single reserve after the batch: %+v %v, want the batch's reservation", again, err)
	}

	comp := c.CompleteMany(ctx, ns, []client.CompleteRequest{
		{Key: "a", OwnerToken: res[0].OwnerToken, Response: okResponse("A")},
		{Key: "b", OwnerToken: "not-the-owner-token-01", Response: okResponse("B")},
		{Key: "held", OwnerToken: held.OwnerToken, Response: okResponse("H")},
		{Key: "b", OwnerToken: res[2].OwnerToken, Response: client.Response{Status: 99}},
	})
	if comp[0].Err != nil || comp[0].CompletedAt.IsZero() || comp[2].Err != nil {
		t.Fatalf("completes: %+v", comp)
	}
	if !errors.Is(comp[1].Err, client.ErrNotOwner) {
		t.Fatalf("complete by another token: %v, want ErrNotOwner", comp[1].Err)
	}
	if !errors.Is(comp[3].Err, client.ErrInvalidArgument) {
		t.Fatalf("complete with status 99: %v, want ErrInvalidArgument", comp[3].Err)
	}
	// Repeating a complete that succeeded answers the same times.
	rep := c.CompleteMany(ctx, ns, []client.CompleteRequest{{Key: "a", OwnerToken: res[0].OwnerToken, Response: okResponse("A")}})
	if rep[0].Err != nil || !rep[0].CompletedAt.Equal(comp[0].CompletedAt) {
		t.Fatalf("repeated complete: %+v, first %+v", rep[0], comp[0])
	}

	res = c.ReserveMany(ctx, ns, []client.ReserveRequest{{Key: "a", Fingerprint: "fa"}, {Key: "a", Fingerprint: "other"}, {Key: "held"}})
	if res[0].Outcome != client.OutcomeCompleted || string(res[0].Response.Body) != "A" {
		t.Fatalf("completed key: %+v", res[0])
	}
	if res[1].Outcome != client.OutcomeFingerprintMismatch {
		t.Fatalf("other fingerprint: %+v", res[1])
	}
	if res[2].Outcome != client.OutcomeCompleted || string(res[2].Response.Body) != "H" {
		t.Fatalf("held key completed by its single owner: %+v", res[2])
	}
}

// TestReserveManySplitsAndRetries: more items than one RPC carries are sent
// in several, and a batch whose answer was lost is sent again with the same
// owner tokens, so every item comes back as the same reservation.
func TestReserveManySplitsAndRetries(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()}, noRouting)
	const n = 2*client.MaxBatchItems + 7
	reqs := make([]client.ReserveRequest, n)
	for i := range reqs {
		reqs[i] = client.ReserveRequest{Key: fmt.Sprintf("k%04d", i)}
	}
	srv.DropNext("BatchReserve", 1)
	res := c.ReserveMany(t.Context(), ns, reqs)
	for i, r := range res {
		if r.Err != nil || r.Outcome != client.OutcomeAcquired {
			t.Fatalf("item %d: %+v", i, r)
		}
	}
	if got := srv.Calls("BatchReserve"); got != 4 {
		t.Fatalf("%d BatchReserve RPCs, want 4 (3 batches, one sent twice)", got)
	}
	// A whole batch refused for good fails each item with its error.
	srv.FailNext("BatchComplete", 1, 7) // PermissionDenied
	comp := c.CompleteMany(t.Context(), ns, []client.CompleteRequest{{Key: "k0000", OwnerToken: res[0].OwnerToken, Response: okResponse("x")}})
	if comp[0].Err == nil {
		t.Fatal("a refused batch answered its item without error")
	}
}

// TestOnceBatch: every event runs at most once to completion across
// batches; a failed one runs again, a permanent failure and a success
// replay; an event listed twice runs once; an event another consumer holds
// is waited for and replayed.
func TestOnceBatch(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()}, noRouting)
	ctx := t.Context()

	other, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "e-held"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs := map[string]int{}
	var order []string
	var failE3 atomic.Bool
	failE3.Store(true)
	fn := func(ctx context.Context, id string, token uint64) error {
		mu.Lock()
		runs[id]++
		order = append(order, id)
		mu.Unlock()
		if token == 0 {
			return fmt.Errorf("event %s ran without a fencing token", id)
		}
		switch id {
		case "e1":
			// The other consumer finishes while this batch runs.
			if _, err := c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: "e-held", OwnerToken: other.OwnerToken, Response: client.Response{Status: 200}}); err != nil {
				return fmt.Errorf("completing e-held: %w", err)
			}
		case "e3":
			if failE3.Load() {
				return errors.New("downstream down")
			}
		case "e4":
			return client.Permanent(errors.New("malformed event"))
		}
		return nil
	}
	ids := []string{"e1", "e2", "e3", "e2", "e4", "e-held", "bad id"}
	res := c.OnceBatch(ctx, ns, ids, fn)
	if len(res) != len(ids) {
		t.Fatalf("%d results for %d events", len(res), len(ids))
	}
	check := func(i int, ran bool, errOK func(error) bool) {
		t.Helper()
		if res[i].Ran != ran || !errOK(res[i].Err) {
			t.Fatalf("event %d (%s): %+v", i, ids[i], res[i])
		}
	}
	isNil := func(err error) bool { return err == nil }
	var perm *client.PermanentError
	isPerm := func(err error) bool { return errors.As(err, &perm) }
	check(0, true, isNil)
	check(1, true, isNil)
	check(2, true, func(err error) bool { return err != nil && err.Error() == "downstream down" })
	check(3, false, isNil) // the second copy of e2 replays the first
	check(4, true, isPerm)
	check(5, false, isNil) // completed by the other consumer
	check(6, false, func(err error) bool { return errors.Is(err, client.ErrInvalidArgument) })
	if runs["e2"] != 1 || runs["e-held"] != 0 {
		t.Fatalf("runs: %v", runs)
	}
	if fmt.Sprint(order) != "[e1 e2 e3 e4]" {
		t.Fatalf("fn ran in order %v, want the batch's", order)
	}

	// Redelivery of the whole batch: only the failed event runs again.
	failE3.Store(false)
	res = c.OnceBatch(ctx, ns, ids[:6], fn)
	check(0, false, isNil)
	check(1, false, isNil)
	check(2, true, isNil)
	check(3, false, isNil)
	check(4, false, isPerm)
	check(5, false, isNil)
	if runs["e1"] != 1 || runs["e2"] != 1 || runs["e3"] != 2 || runs["e4"] != 1 {
		t.Fatalf("runs after redelivery: %v", runs)
	}
}
