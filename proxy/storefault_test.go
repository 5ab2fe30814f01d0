package proxy_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/httpidem"
	"github.com/idem-dev/idem/proxy"
)

// faultStore is the proxy's real store over the in-memory backend, with the
// answers of Complete and Heartbeat replaced by injected errors.
type faultStore struct {
	proxy.Store
	complete  atomic.Pointer[error]
	heartbeat atomic.Pointer[error]
}

func (s *faultStore) Complete(ctx context.Context, ref httpidem.Ref, resp httpidem.Response, retention time.Duration) (httpidem.Completion, error) {
	if err := s.complete.Load(); err != nil {
		return httpidem.Completion{}, *err
	}
	return s.Store.Complete(ctx, ref, resp, retention)
}

func (s *faultStore) Heartbeat(ctx context.Context, ref httpidem.Ref, lease time.Duration) error {
	if err := s.heartbeat.Load(); err != nil {
		return *err
	}
	return s.Store.Heartbeat(ctx, ref, lease)
}

// TestStoringFailsAfterTheUpstreamRan: the upstream ran, then the store
// would not take its response. The caller still gets the response the
// upstream gave (it ran once); what happens to the key depends on why:
// NOT_OWNER (another request reclaimed it meanwhile) leaves it to that
// request, a refused response frees it so a retry runs again, an undecided
// store leaves it reserved (a retry meets 409 until the lease runs out).
func TestStoringFailsAfterTheUpstreamRan(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		wantRecord bool // the key still reserved afterwards
		retry      int  // status of an immediate retry
	}{
		{"not-owner", fmt.Errorf("test: %w", httpidem.ErrNotOwner), true, 409},
		{"refused", fmt.Errorf("test: %w", httpidem.ErrInvalid), false, 201},
		{"undecided", fmt.Errorf("test: %w", httpidem.ErrUnavailable), true, 409},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			be := newBackend(10 * time.Millisecond)
			fs := &faultStore{Store: proxy.BackendStore(be)}
			fs.complete.Store(&tc.err)
			srv, _ := startProxy(t, up.srv.URL, fs)
			key := "k-store-" + tc.name
			if rep := send(t, srv.URL, "POST", "/ok", "x", "Idempotency-Key", key); rep.Status != 201 {
				t.Fatalf("first request: %v, want the upstream's 201", rep)
			}
			if n := up.Runs(key); n != 1 {
				t.Fatalf("upstream ran %d times, want 1", n)
			}
			rec, ok := be.record(t, "default", key)
			if ok != tc.wantRecord || (ok && rec.State != fsm.StateInProgress) {
				t.Fatalf("after a failed complete: record %+v present=%v, want present=%v and never COMPLETED", rec, ok, tc.wantRecord)
			}
			fs.complete.Store(nil)
			rep := send(t, srv.URL, "POST", "/ok", "x", "Idempotency-Key", key)
			if rep.Status != tc.retry {
				t.Fatalf("retry: %v, want %d", rep, tc.retry)
			}
			if tc.retry == 201 && up.Runs(key) != 2 {
				t.Fatalf("a retry of a freed key ran the upstream %d times in all, want 2", up.Runs(key))
			}
		})
	}
}

// TestHeartbeatNotOwnerCancelsTheUpstream: a heartbeat answered NOT_OWNER
// (the key was reclaimed or force-released while the upstream worked)
// cancels the run at once: the caller gets 503 reservation-lost, nothing is
// stored.
func TestHeartbeatNotOwnerCancelsTheUpstream(t *testing.T) {
	up := newUpstream(t)
	be := newBackend(10 * time.Millisecond)
	fs := &faultStore{Store: proxy.BackendStore(be)}
	notOwner := fmt.Errorf("test: %w", httpidem.ErrNotOwner)
	fs.heartbeat.Store(&notOwner)
	srv, _ := startProxy(t, up.srv.URL, fs, func(c *proxy.Config) {
		c.Lease = time.Minute
		c.HeartbeatInterval = 20 * time.Millisecond
	})
	rep := send(t, srv.URL, "POST", "/hang", "x", "Idempotency-Key", "k-hb-lost")
	if slug := problem(t, rep, 503); slug != httpidem.ProblemLeaseLost {
		t.Fatalf("problem %q, want %q", slug, httpidem.ProblemLeaseLost)
	}
	if rec, ok := be.record(t, "default", "k-hb-lost"); ok && rec.State == fsm.StateCompleted {
		t.Fatalf("a run whose lease was lost was stored: %+v", rec)
	}
}
