package proxy_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/proxy"
)

// TestPreferWaitReplaysTheRunningRequest: a retry with "Prefer: wait=N"
// that meets the running request waits in the store and replays its
// response; the upstream runs once. Without Prefer, or with a wait that runs
// out, 409 as before; --max-wait bounds the wait.
func TestPreferWaitReplaysTheRunningRequest(t *testing.T) {
	up := newUpstream(t)
	b := newBackend(time.Second)
	srv, _ := startProxy(t, up.srv.URL, proxy.BackendStore(b))

	first := make(chan reply, 1)
	go func() { first <- send(t, srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-wait") }()
	<-up.started
	problem(t, send(t, srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-wait"), 409)

	waiter := make(chan reply, 1)
	go func() {
		waiter <- send(t, srv.URL, "POST", "/slow", "x", "Idempotency-Key", "k-wait", "Prefer", "respond-async, wait=20")
	}()
	testutil.Eventually(t, 10*time.Second, "the retry to wait in the store", func() (bool, string) {
		n := b.Waiters().Stats().Waiting
		return n == 1, fmt.Sprintf("%d waiting", n)
	})
	close(up.gate)
	got, orig := <-waiter, <-first
	if orig.Status != 201 || got.Status != 201 || got.Body != orig.Body || got.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("waiting retry %v, first %v: want the first's response replayed", got, orig)
	}
	if runs := up.Runs("k-wait"); runs != 1 {
		t.Fatalf("upstream ran %d times", runs)
	}

	// A wait that runs out is 409, after waiting.
	up2 := newUpstream(t)
	srv2, _ := startProxy(t, up2.srv.URL, proxy.BackendStore(newBackend(time.Second)), func(c *proxy.Config) { c.MaxWait = 50 * time.Millisecond })
	go func() { send(t, srv2.URL, "POST", "/slow", "x", "Idempotency-Key", "k-busy") }()
	<-up2.started
	start := time.Now()
	problem(t, send(t, srv2.URL, "POST", "/slow", "x", "Idempotency-Key", "k-busy", "Prefer", "wait=3600"), 409)
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("answered after %v: the wait (bounded by MaxWait 50ms) did not happen", waited)
	}
	close(up2.gate)
}
