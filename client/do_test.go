package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"github.com/idem-dev/idem/internal/testutil"
)

func okResponse(body string) client.Response {
	return client.Response{Status: 200, Headers: map[string]string{"Content-Type": "text/plain"}, Body: []byte(body)}
}

// Twenty callers race on one key: fn runs exactly once and everybody gets its
// response.
func TestDoRunsOnceAcrossConcurrentCallers(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	const callers = 20

	var runs atomic.Int32
	var wg sync.WaitGroup
	results := make([]client.Result, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			results[i], errs[i] = c.Do(t.Context(), ns, key, func(ctx context.Context, l client.Lease) (client.Response, error) {
				runs.Add(1)
				// Hold the key until every caller has asked for it at least
				// once, so they really contend.
				deadline := time.Now().Add(10 * time.Second)
				for srv.Calls(idemtest.MethodReserve) < callers && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				return okResponse(fmt.Sprintf("done by %d", l.FencingToken)), nil
			}, client.WithFingerprint("fp"))
		})
	}
	wg.Wait()

	if n := runs.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want exactly once", n)
	}
	ran := 0
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if !results[i].Replayed {
			ran++
		}
		assertResponse(t, results[i].Response, results[0].Response)
		if results[i].FencingToken != results[0].FencingToken || !results[i].CompletedAt.Equal(results[0].CompletedAt) {
			t.Errorf("caller %d: result %+v differs from caller 0's %+v", i, results[i], results[0])
		}
	}
	if ran != 1 {
		t.Errorf("%d callers report they ran fn (Replayed false), want 1", ran)
	}
	if want := fmt.Sprintf("done by %d", results[0].FencingToken); string(results[0].Response.Body) != want {
		t.Errorf("body %q, want %q: fn must see the fencing token of the completing owner", results[0].Response.Body, want)
	}
}

func TestDoReplays(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	want := client.Response{Status: 201, Headers: map[string]string{"Location": "/orders/7"}, Body: []byte(`{"id":7}`)}
	first, err := c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
		return want, nil
	}, client.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || first.ExpiresAt.Sub(first.CompletedAt) != time.Hour {
		t.Errorf("first Do = %+v, want a fresh run retained 1h", first)
	}
	second, err := c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
		t.Error("fn ran again for a completed key")
		return client.Response{Status: 500}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Replayed || second.FencingToken != first.FencingToken || !second.CompletedAt.Equal(first.CompletedAt) {
		t.Errorf("second Do = %+v, want a replay of %+v", second, first)
	}
	assertResponse(t, second.Response, want)
}

func TestDoReleasesOnErrorSoTheKeyRunsAgain(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	errBoom := errors.New("boom")
	var firstToken uint64
	_, err := c.Do(t.Context(), ns, key, func(_ context.Context, l client.Lease) (client.Response, error) {
		firstToken = l.FencingToken
		return client.Response{}, errBoom
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if _, ok := srv.Get(ns, key); ok {
		t.Fatal("key still held after fn failed: it should have been released")
	}
	res, err := c.Do(t.Context(), ns, key, func(_ context.Context, l client.Lease) (client.Response, error) {
		if l.FencingToken <= firstToken || l.Reclaimed {
			t.Errorf("second run's lease = %+v, want a fresh acquisition with a token above %d", l, firstToken)
		}
		return okResponse("second"), nil
	})
	if err != nil || res.Replayed || string(res.Response.Body) != "second" {
		t.Fatalf("second Do = %+v, %v; want fn to run again", res, err)
	}
}

func TestDoPermanentErrorIsStored(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	errDeclined := errors.New("card declined")
	declined := client.Response{Status: 402, Body: []byte("declined")}
	res, err := c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
		return declined, client.Permanent(errDeclined)
	})
	var perm *client.PermanentError
	if !errors.Is(err, errDeclined) || !errors.As(err, &perm) {
		t.Fatalf("Do = %v, want the permanent error", err)
	}
	assertResponse(t, res.Response, declined)
	again, err := c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
		t.Error("fn ran again after a permanent failure")
		return client.Response{}, nil
	})
	if err != nil || !again.Replayed {
		t.Fatalf("second Do = %+v, %v; want a replay", again, err)
	}
	assertResponse(t, again.Response, declined)
}

func TestDoPanicReleases(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	func() {
		defer func() {
			if r := recover(); r != "oops" {
				t.Errorf("recovered %v, want fn's panic to go on", r)
			}
		}()
		_, _ = c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
			panic("oops")
		})
	}()
	if _, ok := srv.Get(ns, key); ok {
		t.Error("key still held after fn panicked")
	}
}

func TestDoInvalidResponseReleases(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	_, err := c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
		return client.Response{}, nil // status 0 cannot be stored
	})
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("Do = %v, want ErrInvalidArgument", err)
	}
	if _, ok := srv.Get(ns, key); ok {
		t.Error("key still held after its response was refused")
	}
}

// An owner that crashed leaves the key reserved; once its lease ends, Do
// reclaims it and tells fn.
func TestDoReclaimsAndHandsFencingTokens(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	crashed, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: key, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv.Advance(time.Second + idemtest.DefaultSkewMargin)
	var lease client.Lease
	res, err := c.Do(t.Context(), ns, key, func(_ context.Context, l client.Lease) (client.Response, error) {
		lease = l
		return okResponse("x"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !lease.Reclaimed || lease.PreviousFencingToken != crashed.FencingToken || lease.FencingToken <= crashed.FencingToken || lease.OwnerToken == "" || lease.ExpiresAt.IsZero() {
		t.Errorf("lease = %+v, want a reclaim from fencing token %d", lease, crashed.FencingToken)
	}
	if res.FencingToken != lease.FencingToken {
		t.Errorf("result fencing token %d, want the lease's %d", res.FencingToken, lease.FencingToken)
	}
	if _, err := c.Complete(t.Context(), client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: crashed.OwnerToken, Response: okResponse("late")}); !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("the crashed owner's late complete = %v, want ErrNotOwner", err)
	}
}

// Another caller reclaims the key while fn runs: the next heartbeat answers
// NOT_OWNER and fn's context is cancelled with ErrLeaseLost.
func TestDoLeaseLostCancelsFn(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	started := make(chan client.Lease, 1)
	var cause error
	done := make(chan error, 1)
	go func() {
		_, err := c.Do(t.Context(), ns, key, func(ctx context.Context, l client.Lease) (client.Response, error) {
			started <- l
			<-ctx.Done()
			cause = context.Cause(ctx)
			return client.Response{}, ctx.Err()
		}, client.WithLease(300*time.Millisecond))
		done <- err
	}()
	lease := <-started

	// Heartbeats keep renewing the lease; move the store's clock past it
	// until a rival's reserve lands between two renewals.
	var rival client.Reservation
	testutil.Eventually(t, 10*time.Second, "a rival to reclaim the key", func() (bool, string) {
		srv.Advance(2 * time.Second)
		var err error
		rival, err = c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: key})
		return err == nil && rival.Outcome == client.OutcomeReclaimed, fmt.Sprintf("%+v, %v", rival, err)
	})
	if rival.PreviousFencingToken != lease.FencingToken {
		t.Errorf("rival reclaimed from fencing token %d, want %d", rival.PreviousFencingToken, lease.FencingToken)
	}
	err := <-done
	if !errors.Is(err, client.ErrLeaseLost) || !errors.Is(err, context.Canceled) {
		t.Errorf("Do = %v, want ErrLeaseLost wrapping fn's context error", err)
	}
	if !errors.Is(cause, client.ErrLeaseLost) || !errors.Is(cause, client.ErrNotOwner) {
		t.Errorf("fn's context cause = %v, want ErrLeaseLost from a NOT_OWNER heartbeat", cause)
	}
	if rec, ok := srv.Get(ns, key); !ok || rec.FencingToken != rival.FencingToken {
		t.Errorf("record %+v, want the rival still owning it: the lost owner must not release it", rec)
	}
}

// Heartbeats that keep failing until the lease ends cancel fn too.
func TestDoLeaseLostWhenHeartbeatsFail(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	srv.FailNext(idemtest.MethodHeartbeat, -1, codes.Unavailable)
	var cause error
	start := time.Now()
	_, err := c.Do(t.Context(), ns, client.NewKey(), func(ctx context.Context, _ client.Lease) (client.Response, error) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return client.Response{}, ctx.Err()
	}, client.WithLease(200*time.Millisecond))
	if !errors.Is(err, client.ErrLeaseLost) || !errors.Is(cause, client.ErrLeaseLost) {
		t.Errorf("Do = %v (fn's cause %v), want ErrLeaseLost", err, cause)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("fn was cancelled after %v, before its 200ms lease ran out", took)
	}
	if srv.Calls(idemtest.MethodHeartbeat) == 0 {
		t.Error("no heartbeat was tried")
	}
}

// fn finishes, but meanwhile somebody else took the key: completing answers
// NOT_OWNER and Do reports the lost lease instead of a success.
func TestDoCompleteAfterLeaseLost(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	_, err := c.Do(t.Context(), ns, key, func(ctx context.Context, l client.Lease) (client.Response, error) {
		srv.Advance(client.DefaultLease + 2*idemtest.DefaultSkewMargin)
		rival, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
		if err != nil || rival.Outcome != client.OutcomeReclaimed {
			t.Errorf("rival reserve = %+v, %v; want RECLAIMED", rival, err)
		}
		return okResponse("too late"), nil
	})
	if !errors.Is(err, client.ErrLeaseLost) || !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("Do = %v, want ErrLeaseLost", err)
	}
}

func TestDoWaitsForAnotherOwner(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	holder, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	never := func(context.Context, client.Lease) (client.Response, error) {
		t.Error("fn ran while another owner held the key")
		return client.Response{}, nil
	}

	if _, err := c.Do(t.Context(), ns, key, never, client.WithMaxWait(0)); !errors.Is(err, client.ErrInProgress) {
		t.Errorf("Do without waiting = %v, want ErrInProgress", err)
	}
	if _, err := c.Do(t.Context(), ns, key, never, client.WithMaxWait(30*time.Millisecond)); !errors.Is(err, client.ErrInProgress) {
		t.Errorf("Do waiting 30ms = %v, want ErrInProgress", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	_, err = c.Do(ctx, ns, key, never, client.WithMaxWait(time.Minute))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do past its context's deadline = %v, want DeadlineExceeded", err)
	}

	// A waiter gets the holder's response once it completes.
	before := srv.Calls(idemtest.MethodReserve)
	type outcome struct {
		res client.Result
		err error
	}
	waiter := make(chan outcome, 1)
	go func() {
		res, err := c.Do(t.Context(), ns, key, never, client.WithMaxWait(time.Minute))
		waiter <- outcome{res, err}
	}()
	testutil.Eventually(t, 10*time.Second, "the waiter to wait in the store", func() (bool, string) {
		n := srv.Calls(idemtest.MethodReserve) - before
		return n >= 2, fmt.Sprintf("%d reserves", n)
	})
	want := okResponse("from the holder")
	if _, err := c.Complete(t.Context(), client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: holder.OwnerToken, Response: want}); err != nil {
		t.Fatal(err)
	}
	got := <-waiter
	if got.err != nil || !got.res.Replayed {
		t.Fatalf("waiter = %+v, %v; want the holder's response replayed", got.res, got.err)
	}
	assertResponse(t, got.res.Response, want)
	// No polling: one reserve answered IN_PROGRESS, the next waited in the
	// store (wait_ms) until the complete woke it.
	if n := srv.Calls(idemtest.MethodReserve) - before; n != 2 {
		t.Errorf("the waiter sent %d reserves, want 2", n)
	}
}

func TestDoFingerprintMismatch(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	if _, err := c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
		return okResponse("a"), nil
	}, client.WithFingerprint("request-a")); err != nil {
		t.Fatal(err)
	}
	_, err := c.Do(t.Context(), ns, key, func(context.Context, client.Lease) (client.Response, error) {
		t.Error("fn ran for a key used by another request")
		return client.Response{}, nil
	}, client.WithFingerprint("request-b"))
	if !errors.Is(err, client.ErrFingerprintMismatch) {
		t.Errorf("Do = %v, want ErrFingerprintMismatch", err)
	}
}

// A reserve whose answer is lost inside Do is retried as the same
// reservation: fn runs once, with the fencing token the store recorded.
func TestDoSurvivesLostReserveAnswer(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	key := client.NewKey()
	srv.DropNext(idemtest.MethodReserve, 2)
	srv.DropNext(idemtest.MethodComplete, 1)
	runs := 0
	var lease client.Lease
	res, err := c.Do(t.Context(), ns, key, func(_ context.Context, l client.Lease) (client.Response, error) {
		runs++
		lease = l
		return okResponse("once"), nil
	})
	if err != nil || runs != 1 || res.Replayed {
		t.Fatalf("Do = %+v, %v after %d runs; want one fresh run", res, err, runs)
	}
	rec, ok := srv.Get(ns, key)
	if !ok || rec.FencingToken != lease.FencingToken || lease.Reclaimed {
		t.Errorf("stored record %+v, fn's lease %+v: the retried reserve must be the first reservation", rec, lease)
	}
}

func TestDoOptionsValidated(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	fn := func(context.Context, client.Lease) (client.Response, error) { return okResponse(""), nil }
	for name, opt := range map[string]client.DoOption{
		"lease":     client.WithLease(time.Hour),
		"retention": client.WithRetention(time.Millisecond),
		"max wait":  client.WithMaxWait(-time.Second),
	} {
		if _, err := c.Do(t.Context(), ns, client.NewKey(), fn, opt); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("%s: Do = %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := c.Do(t.Context(), ns, client.NewKey(), nil); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("nil fn: Do = %v, want ErrInvalidArgument", err)
	}
	if n := srv.Calls(idemtest.MethodReserve); n != 0 {
		t.Errorf("%d reserves reached the server with invalid options", n)
	}
}
