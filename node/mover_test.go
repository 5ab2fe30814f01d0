package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// inOrder asks everything at once, answers in order, and stop cancels
// what the caller did not wait for.
func TestInOrderAsksAtOnceAndStops(t *testing.T) {
	const count = 5
	// Every ask but the last waits until all have started: asked one after
	// another, the first would give up after 10 s.
	var started, done sync.WaitGroup
	started.Add(count)
	done.Add(count)
	var canceled atomic.Int32
	answer, stop := inOrder(t.Context(), count, func(ctx context.Context, i int) (int, error) {
		defer done.Done()
		started.Done()
		giveUp := time.After(10 * time.Second)
		if i == count-1 { // the one the caller never waits for
			select {
			case <-ctx.Done():
				canceled.Add(1)
				return 0, ctx.Err()
			case <-giveUp:
				return 0, errors.New("not canceled")
			}
		}
		all := make(chan struct{})
		go func() { started.Wait(); close(all) }()
		select {
		case <-all:
			return i * 10, nil
		case <-giveUp:
			return 0, errors.New("the others were not asked")
		}
	})
	for i := range count - 1 {
		v, err := answer(i)
		if err != nil || v != i*10 {
			t.Fatalf("answer(%d) = %d, %v; want %d", i, v, err, i*10)
		}
	}
	stop()
	done.Wait()
	if canceled.Load() != 1 {
		t.Fatal("stop did not cancel the ask nobody waited for")
	}
}
