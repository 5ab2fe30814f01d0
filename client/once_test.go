package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
	"github.com/idem-dev/idem/internal/testutil"
)

// A consumer handed every event three times, out of order and by several
// workers at once, runs each event exactly once.
func TestOnceEachEventExactlyOnce(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	const events, copies, workers = 60, 3, 8
	seed := testutil.Seed(t)
	rng := testutil.Rand(seed, seed)

	var deliveries []string
	for e := range events {
		for range copies {
			deliveries = append(deliveries, fmt.Sprintf("evt-%03d", e))
		}
	}
	rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })

	var mu sync.Mutex
	runs := make(map[string]int)
	tokens := make(map[string]uint64)
	ranTrue := make(map[string]int)
	queue := make(chan string)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for id := range queue {
				ran, err := c.Once(t.Context(), ns, id, func(ctx context.Context, token uint64) error {
					mu.Lock()
					runs[id]++
					tokens[id] = token
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Errorf("%s: %v", id, err)
				}
				if ran {
					mu.Lock()
					ranTrue[id]++
					mu.Unlock()
				}
			}
		})
	}
	for _, id := range deliveries {
		queue <- id
	}
	close(queue)
	wg.Wait()
	for e := range events {
		id := fmt.Sprintf("evt-%03d", e)
		if runs[id] != 1 || ranTrue[id] != 1 || tokens[id] == 0 {
			t.Errorf("%s: fn ran %d times, ran=true %d times, token %d", id, runs[id], ranTrue[id], tokens[id])
		}
	}
}

func TestOnceFailedEventRunsAgain(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	errBroken := errors.New("downstream broken")
	var calls []uint64
	fn := func(ctx context.Context, token uint64) error {
		calls = append(calls, token)
		if len(calls) == 1 {
			return errBroken
		}
		return nil
	}
	if ran, err := c.Once(t.Context(), ns, "evt-fail", fn); !ran || !errors.Is(err, errBroken) {
		t.Errorf("first delivery: %v, %v", ran, err)
	}
	if ran, err := c.Once(t.Context(), ns, "evt-fail", fn); !ran || err != nil {
		t.Errorf("redelivery: %v, %v", ran, err)
	}
	if ran, err := c.Once(t.Context(), ns, "evt-fail", fn); ran || err != nil {
		t.Errorf("after success: %v, %v", ran, err)
	}
	if len(calls) != 2 || calls[1] <= calls[0] {
		t.Errorf("fn's fencing tokens %v: two runs, the second with a larger token", calls)
	}
}

func TestOncePermanentFailureIsRecorded(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	runs := 0
	fn := func(ctx context.Context, token uint64) error {
		runs++
		return client.Permanent(errors.New("malformed event"))
	}
	ran, err := c.Once(t.Context(), ns, "evt-poison", fn)
	var perm *client.PermanentError
	if !ran || !errors.As(err, &perm) {
		t.Errorf("first: %v, %v", ran, err)
	}
	ran, err = c.Once(t.Context(), ns, "evt-poison", fn)
	if ran || !errors.As(err, &perm) || !strings.Contains(err.Error(), "malformed event") {
		t.Errorf("redelivery: %v, %v", ran, err)
	}
	if runs != 1 {
		t.Errorf("fn ran %d times", runs)
	}
}

func TestOnceConcurrentDeliveryWaitsForTheRunner(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	started, gate := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	runs := 0
	fn := func(ctx context.Context, token uint64) error {
		mu.Lock()
		runs++
		mu.Unlock()
		close(started)
		<-gate
		return nil
	}
	type result struct {
		ran bool
		err error
	}
	first := make(chan result, 1)
	go func() {
		ran, err := c.Once(t.Context(), ns, "evt-dup", fn)
		first <- result{ran, err}
	}()
	<-started
	second := make(chan result, 1)
	go func() {
		ran, err := c.Once(t.Context(), ns, "evt-dup", fn)
		second <- result{ran, err}
	}()
	// The second delivery polls while the first holds the event.
	testutil.Eventually(t, 10*time.Second, "the second delivery to find the event in progress", func() (bool, string) {
		n := srv.Calls(idemtest.MethodReserve)
		return n >= 3, fmt.Sprintf("%d reserves", n)
	})
	select {
	case r := <-second:
		t.Fatalf("the second delivery returned while the first ran: %+v", r)
	default:
	}
	close(gate)
	if r := <-first; !r.ran || r.err != nil {
		t.Errorf("first: %+v", r)
	}
	if r := <-second; r.ran || r.err != nil {
		t.Errorf("second: %+v", r)
	}
	if runs != 1 {
		t.Errorf("fn ran %d times", runs)
	}
}

func TestOnceNilFn(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	if _, err := c.Once(t.Context(), ns, "evt", nil); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("nil fn: %v", err)
	}
}
