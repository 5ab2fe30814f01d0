package client_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		adjust func(*client.Config)
		want   []string // substrings, one per expected problem
	}{
		{"defaults", func(*client.Config) {}, nil},
		{"zeros take defaults", func(c *client.Config) { *c = client.Config{Endpoints: c.Endpoints} }, nil},
		{"no endpoints", func(c *client.Config) { c.Endpoints = nil }, []string{"Endpoints is empty"}},
		{"bad endpoint", func(c *client.Config) { c.Endpoints = []string{"127.0.0.1:7070", "nohost"} }, []string{`Endpoints[1] = "nohost"`}},
		{"negatives", func(c *client.Config) {
			c.MaxAttempts, c.BaseBackoff, c.MaxBackoff, c.RequestTimeout = -1, -1, -1, -1
		}, []string{"MaxAttempts", "BaseBackoff", "MaxBackoff = -1ns is negative", "RequestTimeout"}},
		{"backoff order", func(c *client.Config) { c.BaseBackoff, c.MaxBackoff = time.Second, time.Millisecond }, []string{"below BaseBackoff"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := client.DefaultConfig("127.0.0.1:7070")
			tt.adjust(&cfg)
			err := cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				c, err := client.New(cfg)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				_ = c.Close()
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want problems %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, missing %q", err, w)
				}
			}
			if _, err := client.New(cfg); err == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
}

func TestReserveLifecycle(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()
	key := client.NewKey()

	first, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key, Fingerprint: "fp", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if first.Outcome != client.OutcomeAcquired || first.FencingToken == 0 {
		t.Fatalf("first reserve = %+v, want ACQUIRED with a fencing token", first)
	}
	if !regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`).MatchString(first.OwnerToken) {
		t.Errorf("generated owner token %q is not 128 bits of base64url", first.OwnerToken)
	}
	// The store's clock is this machine's: the lease ends a minute after the
	// reserve (less the round trip, however slow the box).
	if d := time.Until(first.LeaseExpiresAt); d <= 0 || d > time.Minute {
		t.Errorf("lease expires in %v, want within the minute asked for", d)
	}

	other, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key, Fingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	if other.Outcome != client.OutcomeInProgress || other.RetryAfter <= 0 || !other.LeaseExpiresAt.Equal(first.LeaseExpiresAt) {
		t.Fatalf("second owner's reserve = %+v, want IN_PROGRESS with a retry hint and the first lease's end", other)
	}
	if _, err := c.Heartbeat(ctx, client.HeartbeatRequest{Namespace: ns, Key: key, OwnerToken: other.OwnerToken}); !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("heartbeat by a non-owner = %v, want ErrNotOwner", err)
	}
	if status.Code(errors.Unwrap(fmt.Errorf("x: %w", client.ErrNotOwner))) != codes.Unknown {
		t.Fatal("status.Code of a bare sentinel should be Unknown")
	}

	renewed, err := c.Heartbeat(ctx, client.HeartbeatRequest{Namespace: ns, Key: key, OwnerToken: first.OwnerToken, Lease: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !renewed.After(first.LeaseExpiresAt) {
		t.Errorf("heartbeat moved the lease end to %v, not past %v", renewed, first.LeaseExpiresAt)
	}

	rec, err := c.Get(ctx, ns, key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != client.StateInProgress || rec.FencingToken != first.FencingToken || rec.Fingerprint != "fp" || !rec.LeaseExpiresAt.Equal(renewed) {
		t.Errorf("Get of a reserved key = %+v", rec)
	}

	want := client.Response{Status: 201, Headers: map[string]string{"Content-Type": "text/plain", "X-A": "1, 2"}, Body: []byte("created")}
	comp, err := c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: first.OwnerToken, Response: want, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if d := comp.ExpiresAt.Sub(comp.CompletedAt); d != time.Hour {
		t.Errorf("retention = %v, want 1h", d)
	}

	replay, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key, Fingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	if replay.Outcome != client.OutcomeCompleted || replay.FencingToken != first.FencingToken ||
		!replay.CompletedAt.Equal(comp.CompletedAt) || !replay.ExpiresAt.Equal(comp.ExpiresAt) {
		t.Fatalf("reserve after complete = %+v", replay)
	}
	assertResponse(t, *replay.Response, want)

	mismatch, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key, Fingerprint: "other"})
	if err != nil || mismatch.Outcome != client.OutcomeFingerprintMismatch {
		t.Errorf("reserve with another fingerprint = %+v, %v; want FINGERPRINT_MISMATCH", mismatch, err)
	}
	if err := c.Release(ctx, client.ReleaseRequest{Namespace: ns, Key: key, OwnerToken: first.OwnerToken}); !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("release of a completed key = %v, want ErrNotOwner", err)
	}
	rec, err = c.Get(ctx, ns, key)
	if err != nil || rec.State != client.StateCompleted || rec.Response == nil {
		t.Fatalf("Get of a completed key = %+v, %v", rec, err)
	}
	assertResponse(t, *rec.Response, want)

	_, err = c.Get(ctx, ns, client.NewKey())
	if !errors.Is(err, client.ErrNotFound) || status.Code(err) != codes.NotFound {
		t.Errorf("Get of an absent key = %v, want ErrNotFound wrapping NOT_FOUND", err)
	}
}

func assertResponse(t *testing.T, got, want client.Response) {
	t.Helper()
	if got.Status != want.Status || string(got.Body) != string(want.Body) || !maps.Equal(got.Headers, want.Headers) {
		t.Errorf("response = %+v, want %+v", got, want)
	}
}

func TestReleaseFreesKey(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()
	key := client.NewKey()
	first, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, client.ReleaseRequest{Namespace: ns, Key: key, OwnerToken: first.OwnerToken}); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, client.ReleaseRequest{Namespace: ns, Key: key, OwnerToken: first.OwnerToken}); !errors.Is(err, client.ErrNotOwner) {
		t.Errorf("second release = %v, want ErrNotOwner", err)
	}
	second, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if second.Outcome != client.OutcomeAcquired || second.FencingToken <= first.FencingToken {
		t.Errorf("reserve after release = %+v, want ACQUIRED with a fencing token above %d", second, first.FencingToken)
	}
}

// A reserve whose answers are lost is retried with the same owner token and
// comes back as the one reservation the store made: never a second ACQUIRED.
func TestReserveRetriedAfterLostAnswers(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()
	key := client.NewKey()

	srv.DropNext(idemtest.MethodReserve, 3)
	res, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Calls(idemtest.MethodReserve); got != 4 {
		t.Fatalf("server saw %d reserves, want 4 (3 lost answers and the one that got through)", got)
	}
	if res.Outcome != client.OutcomeAcquired {
		t.Fatalf("retried reserve = %v, want ACQUIRED", res.Outcome)
	}
	rec, ok := srv.Get(ns, key)
	if !ok || rec.FencingToken != res.FencingToken || rec.OwnerToken != res.OwnerToken {
		t.Fatalf("stored record %+v; want fencing token %d of owner %q: the retry made a second reservation", rec, res.FencingToken, res.OwnerToken)
	}
	// The first, lost attempt made the reservation: its index is the fencing
	// token, and the retries did not move it.
	other, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil || other.Outcome != client.OutcomeInProgress {
		t.Fatalf("another owner's reserve = %+v, %v; want IN_PROGRESS", other, err)
	}
	if _, err := c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: res.OwnerToken, Response: client.Response{Status: 200}}); err != nil {
		t.Fatalf("the owner of the retried reserve cannot complete: %v", err)
	}
}

func TestRetriesRunOut(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()}, func(cfg *client.Config) { cfg.MaxAttempts = 3 })
	ctx := t.Context()
	key := client.NewKey()

	srv.FailNext(idemtest.MethodReserve, 3, codes.Unavailable)
	res, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if !errors.Is(err, client.ErrUnavailable) || status.Code(err) != codes.Unavailable {
		t.Fatalf("reserve failing 3 of 3 attempts = %v, want ErrUnavailable wrapping UNAVAILABLE", err)
	}
	if got := srv.Calls(idemtest.MethodReserve); got != 3 {
		t.Errorf("server saw %d attempts, want MaxAttempts = 3", got)
	}
	if res.OwnerToken == "" {
		t.Fatal("a failed reserve must return the owner token it used, for the caller's retry")
	}
	// The caller retries with the token it got back.
	again, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key, OwnerToken: res.OwnerToken})
	if err != nil || again.Outcome != client.OutcomeAcquired || again.OwnerToken != res.OwnerToken {
		t.Fatalf("retry with the same token = %+v, %v", again, err)
	}

	// Server-side deadlines and leader changes are retried too.
	srv.FailNext(idemtest.MethodGet, 1, codes.DeadlineExceeded)
	srv.FailNext(idemtest.MethodHeartbeat, 2, codes.Aborted)
	if _, err := c.Get(ctx, ns, key); err != nil {
		t.Errorf("get after one server-side DEADLINE_EXCEEDED: %v", err)
	}
	if _, err := c.Heartbeat(ctx, client.HeartbeatRequest{Namespace: ns, Key: key, OwnerToken: res.OwnerToken}); err != nil {
		t.Errorf("heartbeat after two ABORTED: %v", err)
	}
}

func TestDecidedErrorsAreNotRetried(t *testing.T) {
	tests := []struct {
		code codes.Code
		want error // nil: no sentinel, just the status
	}{
		{codes.FailedPrecondition, client.ErrNotOwner},
		{codes.NotFound, client.ErrNotFound},
		{codes.InvalidArgument, client.ErrInvalidArgument},
		{codes.ResourceExhausted, client.ErrPayloadTooLarge},
		{codes.Internal, nil},
		{codes.PermissionDenied, nil},
	}
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	sentinels := []error{client.ErrNotOwner, client.ErrNotFound, client.ErrInvalidArgument, client.ErrPayloadTooLarge, client.ErrUnavailable}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			before := srv.Calls(idemtest.MethodRelease)
			srv.FailNext(idemtest.MethodRelease, 1, tt.code)
			err := c.Release(t.Context(), client.ReleaseRequest{Namespace: ns, Key: "k", OwnerToken: client.NewOwnerToken()})
			if got := srv.Calls(idemtest.MethodRelease) - before; got != 1 {
				t.Errorf("%d attempts, want 1: a decided failure must not be retried", got)
			}
			if status.Code(err) != tt.code {
				t.Errorf("status.Code(%v) = %v, want %v", err, status.Code(err), tt.code)
			}
			for _, s := range sentinels {
				if errors.Is(err, s) != (s == tt.want) {
					t.Errorf("errors.Is(%v, %v) = %v", err, s, errors.Is(err, s))
				}
			}
		})
	}
}

func TestClientSideValidation(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()
	tok := client.NewOwnerToken()
	calls := []struct {
		name string
		call func() error
	}{
		{"namespace upper case", func() error {
			_, err := c.Reserve(ctx, client.ReserveRequest{Namespace: "Bad", Key: "k"})
			return err
		}},
		{"key with space", func() error {
			_, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "a b"})
			return err
		}},
		{"key too long", func() error {
			_, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: strings.Repeat("k", 256)})
			return err
		}},
		{"lease too short", func() error {
			_, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "k", Lease: time.Millisecond})
			return err
		}},
		{"fingerprint too long", func() error {
			_, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "k", Fingerprint: strings.Repeat("f", 257)})
			return err
		}},
		{"owner token too short", func() error {
			_, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "k", OwnerToken: "short"})
			return err
		}},
		{"heartbeat without token", func() error {
			_, err := c.Heartbeat(ctx, client.HeartbeatRequest{Namespace: ns, Key: "k"})
			return err
		}},
		{"status 0", func() error {
			_, err := c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: "k", OwnerToken: tok})
			return err
		}},
		{"retention too long", func() error {
			_, err := c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: "k", OwnerToken: tok, Response: client.Response{Status: 200}, Retention: 31 * 24 * time.Hour})
			return err
		}},
		{"release bad token", func() error {
			return c.Release(ctx, client.ReleaseRequest{Namespace: ns, Key: "k", OwnerToken: "no spaces allowed here"})
		}},
		{"get empty key", func() error {
			_, err := c.Get(ctx, ns, "")
			return err
		}},
	}
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, client.ErrInvalidArgument) {
				t.Errorf("err = %v, want ErrInvalidArgument", err)
			}
		})
	}
	for _, m := range []idemtest.Method{idemtest.MethodReserve, idemtest.MethodHeartbeat, idemtest.MethodComplete, idemtest.MethodRelease, idemtest.MethodGet} {
		if n := srv.Calls(m); n != 0 {
			t.Errorf("%d %s calls reached the server; invalid arguments must fail before sending", n, m)
		}
	}
}

func TestServerLimits(t *testing.T) {
	srv := startServer(t, idemtest.Config{MaxResponseBytes: 10})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()
	key := client.NewKey()
	res, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: res.OwnerToken, Response: client.Response{Status: 200, Body: make([]byte, 11)}})
	if !errors.Is(err, client.ErrPayloadTooLarge) {
		t.Errorf("complete with 11 bytes over a 10-byte limit = %v, want ErrPayloadTooLarge", err)
	}
}

// Calls rotate over the endpoints, and a failed attempt moves to the next.
func TestEndpoints(t *testing.T) {
	t.Run("round robin", func(t *testing.T) {
		a := startServer(t, idemtest.Config{})
		b := startServer(t, idemtest.Config{})
		c := newClient(t, []string{a.Addr(), b.Addr()})
		for range 10 {
			if _, err := c.Get(t.Context(), ns, "absent"); !errors.Is(err, client.ErrNotFound) {
				t.Fatal(err)
			}
		}
		if na, nb := a.Calls(idemtest.MethodGet), b.Calls(idemtest.MethodGet); na != 5 || nb != 5 {
			t.Errorf("calls per endpoint = %d, %d; want 5, 5", na, nb)
		}
	})
	t.Run("failover", func(t *testing.T) {
		srv := startServer(t, idemtest.Config{})
		c := newClient(t, []string{deadAddr(t), srv.Addr(), deadAddr(t)})
		for i := range 9 {
			key := fmt.Sprintf("failover-%d", i)
			res, err := c.Reserve(t.Context(), client.ReserveRequest{Namespace: ns, Key: key})
			if err != nil || res.Outcome != client.OutcomeAcquired {
				t.Fatalf("reserve %d with two of three endpoints down = %+v, %v", i, res, err)
			}
		}
		if got := srv.Calls(idemtest.MethodReserve); got != 9 {
			t.Errorf("live endpoint saw %d reserves, want 9", got)
		}
	})
}

func TestLostAnswersOfCompleteAndRelease(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()

	key := client.NewKey()
	res, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	srv.DropNext(idemtest.MethodComplete, 1)
	if _, err := c.Complete(ctx, client.CompleteRequest{Namespace: ns, Key: key, OwnerToken: res.OwnerToken, Response: client.Response{Status: 200, Body: []byte("x")}}); err != nil {
		t.Errorf("complete retried after a lost answer = %v, want success", err)
	}

	key = client.NewKey()
	res, err = c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	srv.DropNext(idemtest.MethodRelease, 1)
	if err := c.Release(ctx, client.ReleaseRequest{Namespace: ns, Key: key, OwnerToken: res.OwnerToken}); err != nil {
		t.Errorf("release retried after a lost answer = %v, want nil (the first attempt freed the key)", err)
	}
	if _, ok := srv.Get(ns, key); ok {
		t.Error("key still held after release")
	}
}

func TestContextBoundsRetries(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()}, func(cfg *client.Config) { cfg.MaxAttempts = 1 << 20 })
	srv.FailNext(idemtest.MethodGet, -1, codes.Unavailable)
	// Long enough for several attempts on a loaded box; the retries (up to
	// a million allowed) end with the context, not with MaxAttempts.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := c.Get(ctx, ns, "k")
	if !errors.Is(err, context.DeadlineExceeded) || status.Code(err) != codes.Unavailable {
		t.Errorf("err = %v, want the context's deadline wrapping the last UNAVAILABLE", err)
	}
	if n := srv.Calls(idemtest.MethodGet); n < 2 {
		t.Errorf("%d attempts before the deadline, want retries", n)
	}
}

func TestClosed(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(t.Context(), ns, "k"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("Get after Close = %v, want ErrClosed", err)
	}
}
