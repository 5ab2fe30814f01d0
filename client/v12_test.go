package client_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/client/idemtest"
)

// Tombstones and checkpoints (API v1.2) as Do, Once, Lease and the
// middleware use them.

func TestDoAfterRetentionIsExpired(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()
	runs := 0
	fn := func(context.Context, client.Lease) (client.Response, error) {
		runs++
		return client.Response{Status: 201}, nil
	}
	if _, err := c.Do(ctx, ns, "pay-1", fn, client.WithRetention(time.Second)); err != nil || runs != 1 {
		t.Fatalf("first Do: %v (runs %d)", err, runs)
	}
	srv.Advance(2 * time.Second)
	res, err := c.Do(ctx, ns, "pay-1", fn)
	if !errors.Is(err, client.ErrExpired) || runs != 1 || res.CompletedAt.IsZero() || res.FencingToken == 0 {
		t.Fatalf("Do past retention: %+v %v (runs %d), want ErrExpired without running", res, err, runs)
	}
	if _, err := c.Do(ctx, ns, "pay-1", fn, client.WithAcquireExpired()); err != nil || runs != 2 {
		t.Fatalf("Do WithAcquireExpired: %v (runs %d)", err, runs)
	}
	// Once: an event recorded long ago is done, not run again.
	ran, err := c.Once(ctx, ns, "event-1", func(context.Context, uint64) error { return nil })
	if !ran || err != nil {
		t.Fatalf("first Once: %v %v", ran, err)
	}
	srv.Advance(client.DefaultLease + 25*time.Hour) // past the default retention
	ran, err = c.Once(ctx, ns, "event-1", func(context.Context, uint64) error { t.Fatal("ran again"); return nil })
	if ran || err != nil {
		t.Fatalf("Once past retention: ran %v, %v", ran, err)
	}
	if rec, err := c.Get(ctx, ns, "event-1"); err != nil || rec.State != client.StateExpired || rec.ExpiredAt.IsZero() {
		t.Fatalf("Get of a tombstone: %+v %v", rec, err)
	}
}

func TestLeaseCheckpointResumes(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	ctx := t.Context()
	// The first attempt charges, checkpoints, then dies without completing
	// (its reservation stays; the lease runs out).
	first, err := c.Reserve(ctx, client.ReserveRequest{Namespace: ns, Key: "order-9", Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Checkpoint(ctx, client.CheckpointRequest{Namespace: ns, Key: "order-9", OwnerToken: first.OwnerToken, Name: "charged", Data: []byte("ch_9")}); err != nil {
		t.Fatal(err)
	}
	srv.Advance(time.Second + 2*idemtest.DefaultSkewMargin)
	var resumed *client.Checkpoint
	_, err = c.Do(ctx, ns, "order-9", func(ctx context.Context, l client.Lease) (client.Response, error) {
		resumed = l.Resume
		if err := l.Checkpoint(ctx, "recorded", nil); err != nil {
			return client.Response{}, err
		}
		return client.Response{Status: 200}, nil
	})
	if err != nil || resumed == nil || resumed.Name != "charged" || string(resumed.Data) != "ch_9" || resumed.FencingToken != first.FencingToken {
		t.Fatalf("reclaiming Do: %v, resume %+v", err, resumed)
	}
	if _, err := c.Checkpoint(ctx, client.CheckpointRequest{Namespace: ns, Key: "order-9", OwnerToken: first.OwnerToken, Name: "late"}); !errors.Is(err, client.ErrNotOwner) {
		t.Fatalf("checkpoint by the replaced owner: %v", err)
	}
}

func TestMiddlewareAnswersGoneAfterRetention(t *testing.T) {
	srv := startServer(t, idemtest.Config{})
	c := newClient(t, []string{srv.Addr()})
	runs := 0
	url := serve(t, client.Middleware(c, func(m *client.MiddlewareConfig) { m.Retention = time.Second })(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
	})))
	if r := post(t, url, "k-1", "{}"); r.Status != http.StatusCreated {
		t.Fatalf("first: %d", r.Status)
	}
	srv.Advance(2 * time.Second)
	r := post(t, url, "k-1", "{}")
	if r.Status != http.StatusGone || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/problem+json") || runs != 1 {
		t.Fatalf("after retention: %d %q %s (runs %d), want 410 problem+json and no run", r.Status, r.Header.Get("Content-Type"), r.Body, runs)
	}
}
