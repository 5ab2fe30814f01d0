package client_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// appService is the application behind the interceptor: its Get runs
// "work" whose kind the request's key names, and counts the runs per
// idempotency key.
type appService struct {
	idemv1.UnimplementedIdempotencyServer
	mu      sync.Mutex
	runs    map[string]int
	started chan struct{}
	gate    chan struct{}
}

func (a *appService) Get(ctx context.Context, req *idemv1.GetRequest) (*idemv1.GetResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	id := fmt.Sprint(md.Get("idempotency-key"))
	a.mu.Lock()
	a.runs[id]++
	run := a.runs[id]
	a.mu.Unlock()
	tok, _ := client.FencingToken(ctx)
	switch req.GetKey() {
	case "notfound":
		st, _ := status.New(codes.NotFound, fmt.Sprintf("no such thing (run %d)", run)).
			WithDetails(&errdetails.ResourceInfo{ResourceName: "thing"})
		return nil, st.Err()
	case "unavailable-once":
		if run == 1 {
			return nil, status.Error(codes.Unavailable, "try again")
		}
	case "slow":
		close(a.started)
		select {
		case <-a.gate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &idemv1.GetResponse{Fingerprint: fmt.Sprintf("run %d of %s", run, req.GetKey()), FencingToken: tok,
		Response: &idemv1.StoredResponse{Status: 201, Headers: map[string]string{"b": "2", "a": "1"}}}, nil
}

func (a *appService) Runs(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[fmt.Sprint([]string{key})]
}

// startApp serves appService behind the interceptor and returns a client of it.
func startApp(t *testing.T, c *client.Client, opts ...client.InterceptorOption) (*appService, idemv1.IdempotencyClient) {
	t.Helper()
	app := &appService{runs: make(map[string]int), started: make(chan struct{}), gate: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(client.UnaryServerInterceptor(c, opts...)))
	idemv1.RegisterIdempotencyServer(gs, app)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return app, idemv1.NewIdempotencyClient(conn)
}

// call makes a Get with key (none when empty) and reports the answer and
// whether it was replayed.
func call(t *testing.T, app idemv1.IdempotencyClient, key, what string) (*idemv1.GetResponse, bool, error) {
	t.Helper()
	ctx := t.Context()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", key)
	}
	var header metadata.MD
	resp, err := app.Get(ctx, &idemv1.GetRequest{Namespace: "app", Key: what}, grpc.Header(&header))
	return resp, len(header.Get("idempotent-replayed")) == 1 && header.Get("idempotent-replayed")[0] == "true", err
}

func TestInterceptorRunsOnceAndReplays(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	app, stub := startApp(t, c)

	first, replayed, err := call(t, stub, "k1", "thing")
	if err != nil || replayed || first.GetFingerprint() != "run 1 of thing" || first.GetFencingToken() == 0 {
		t.Fatalf("first: %v, replayed %v, %v", first, replayed, err)
	}
	again, replayed, err := call(t, stub, "k1", "thing")
	if err != nil || !replayed || !proto.Equal(again, first) {
		t.Errorf("again: %v, replayed %v, %v; want %v", again, replayed, err, first)
	}
	if n := app.Runs("k1"); n != 1 {
		t.Errorf("handler ran %d times", n)
	}
	rec, err := c.Get(t.Context(), "default", "k1")
	if err != nil || rec.FencingToken != first.GetFencingToken() {
		t.Errorf("record %+v, %v; the handler's fencing token was %d", rec, err, first.GetFencingToken())
	}
	if _, _, err := call(t, stub, "k1", "other thing"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("same key, other request: %v", err)
	}
	// A structured-field string is the same key.
	if _, replayed, err := call(t, stub, `"k1"`, "thing"); err != nil || !replayed {
		t.Errorf(`"k1": replayed %v, %v`, replayed, err)
	}
	// No key: runs every time.
	for range 2 {
		if _, replayed, err := call(t, stub, "", "thing"); err != nil || replayed {
			t.Errorf("no key: replayed %v, %v", replayed, err)
		}
	}
	if n := app.Runs(""); n != 2 {
		t.Errorf("key-less calls ran %d times, want 2", n)
	}
	if _, _, err := call(t, stub, "a b", "thing"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("invalid key: %v", err)
	}
}

func TestInterceptorFinalAndReleasedErrors(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	app, stub := startApp(t, c)

	_, _, err1 := call(t, stub, "nf", "notfound")
	_, replayed, err2 := call(t, stub, "nf", "notfound")
	st1, st2 := status.Convert(err1), status.Convert(err2)
	if st1.Code() != codes.NotFound || st2.Code() != codes.NotFound || st2.Message() != st1.Message() || !replayed {
		t.Errorf("final error: %v then %v (replayed %v)", err1, err2, replayed)
	}
	if len(st2.Details()) != 1 {
		t.Errorf("replayed error lost its details: %v", st2.Details())
	}
	if n := app.Runs("nf"); n != 1 {
		t.Errorf("handler ran %d times for a final error", n)
	}

	if _, _, err := call(t, stub, "un", "unavailable-once"); status.Code(err) != codes.Unavailable {
		t.Errorf("first: %v", err)
	}
	resp, replayed, err := call(t, stub, "un", "unavailable-once")
	if err != nil || replayed || resp.GetFingerprint() != "run 2 of unavailable-once" {
		t.Errorf("retry: %v, replayed %v, %v", resp, replayed, err)
	}
}

func TestInterceptorInProgressIsAborted(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	app, stub := startApp(t, c)
	done := make(chan error, 1)
	go func() {
		_, _, err := call(t, stub, "busy", "slow")
		done <- err
	}()
	<-app.started
	if _, _, err := call(t, stub, "busy", "slow"); status.Code(err) != codes.Aborted {
		t.Errorf("while running: %v", err)
	}
	close(app.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, replayed, err := call(t, stub, "busy", "slow"); err != nil || !replayed {
		t.Errorf("after: replayed %v, %v", replayed, err)
	}
}

func TestInterceptorRequireKeyAndStoreDown(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()}, func(cfg *client.Config) { cfg.MaxAttempts = 2 })
	app, stub := startApp(t, c, func(ic *client.InterceptorConfig) { ic.RequireKey = true })
	if _, _, err := call(t, stub, "", "thing"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no key: %v", err)
	}
	srv.FailNext(idemtest.MethodReserve, -1, codes.Unavailable)
	if _, _, err := call(t, stub, "down", "thing"); status.Code(err) != codes.Unavailable {
		t.Errorf("store down: %v", err)
	}
	if n := app.Runs("down"); n != 0 {
		t.Errorf("handler ran %d times without a reservation", n)
	}
}
