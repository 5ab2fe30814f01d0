package naive

import (
	"context"
	"errors"
	"testing"
	"time"
)

func newServer(t *testing.T, cfg ServerConfig) (*Server, *Client) {
	t.Helper()
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c := NewClient(s.Addr(), 2*time.Second)
	t.Cleanup(c.Close)
	return s, c
}

func TestLockSemantics(t *testing.T) {
	_, c := newServer(t, ServerConfig{PersistEvery: -1})
	ctx := context.Background()
	if ok, err := c.SetNX(ctx, "lock:k", "owner a", time.Minute); !ok || err != nil {
		t.Fatalf("first SetNX: %v %v", ok, err)
	}
	if ok, err := c.SetNX(ctx, "lock:k", "owner b", time.Minute); ok || err != nil {
		t.Fatalf("second SetNX: %v %v", ok, err)
	}
	if ok, _ := c.DelIf(ctx, "lock:k", "owner b"); ok {
		t.Fatal("DelIf by a non-owner deleted the lock")
	}
	if ok, _ := c.DelIf(ctx, "lock:k", "owner a"); !ok {
		t.Fatal("DelIf by the owner failed")
	}
	if err := c.Set(ctx, "res:k", "201 with spaces"); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := c.Get(ctx, "res:k"); !ok || err != nil || v != "201 with spaces" {
		t.Fatalf("Get: %q %v %v", v, ok, err)
	}
}

func TestTTLAndClockStep(t *testing.T) {
	s, c := newServer(t, ServerConfig{PersistEvery: -1})
	ctx := context.Background()
	c.SetNX(ctx, "lock:k", "a", time.Hour)
	s.SetClockOffset(2 * time.Hour) // the server's clock steps forward
	if ok, _ := c.SetNX(ctx, "lock:k", "b", time.Hour); !ok {
		t.Fatal("a clock step past the TTL should free the lock (that is the hazard)")
	}
}

func TestCrashLosesUnsyncedWrites(t *testing.T) {
	s, c := newServer(t, ServerConfig{PersistEvery: time.Hour})
	ctx := context.Background()
	c.Set(ctx, "res:k", "x")
	s.Crash()
	if _, _, err := c.Get(ctx, "res:k"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get from a crashed server: %v", err)
	}
	s.Restart()
	if _, ok, err := c.Get(ctx, "res:k"); ok || err != nil {
		t.Fatalf("a write not yet synced survived the crash: %v %v", ok, err)
	}
}

func TestPauseHoldsAnswers(t *testing.T) {
	s, _ := newServer(t, ServerConfig{PersistEvery: -1})
	c := NewClient(s.Addr(), 200*time.Millisecond)
	defer c.Close()
	s.Pause()
	if _, _, err := c.Get(context.Background(), "k"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Get from a paused server: %v", err)
	}
	s.Resume()
	if _, _, err := c.Get(context.Background(), "k"); err != nil {
		t.Fatal(err)
	}
}
