package serving

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

var discard = slog.New(slog.DiscardHandler)

// TestDrainLetsInFlightRequestsFinish: a request running when the drain
// starts gets its answer, and the drain then reports success.
func TestDrainLetsInFlightRequestsFinish(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "done")
	})
	ln := listen(t)
	servers := []Server{HTTP("http", ln, h, discard), GRPC("grpc", listen(t), grpc.NewServer())}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, discard, servers) }()

	answer := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String())
		if err != nil {
			answer <- "error: " + err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answer <- string(b)
	}()
	<-entered
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve after ctx ended: %v", err)
	}
	drained := make(chan error, 1)
	go func() { drained <- Drain(context.Background(), servers) }()
	close(release)
	if got := <-answer; got != "done" {
		t.Fatalf("the in-flight request got %q, want its answer", got)
	}
	if err := <-drained; err != nil {
		t.Fatalf("clean drain: %v", err)
	}
	if _, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		t.Fatal("the listener still accepts after the drain")
	}
}

// TestDrainCutsOffAtTheDeadline: a request that outlives the drain's
// deadline is cut off and the drain says so.
func TestDrainCutsOffAtTheDeadline(t *testing.T) {
	entered := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // until the server cuts the connection
	})
	ln := listen(t)
	servers := []Server{HTTP("proxy", ln, h, discard)}
	go Serve(t.Context(), discard, servers)
	go func() {
		if resp, err := http.Get("http://" + ln.Addr().String()); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := Drain(ctx, servers)
	if err == nil || !strings.Contains(err.Error(), "proxy: drain") {
		t.Fatalf("drain past its deadline: %v, want a proxy drain error", err)
	}
}

type failing struct{ err error }

func (f failing) Serve() error                { return f.err }
func (f failing) Drain(context.Context) error { return nil }
func (f failing) Close()                      {}

// TestServeReturnsTheFirstFailure: a server that fails ends Serve with its
// error, before ctx ends.
func TestServeReturnsTheFirstFailure(t *testing.T) {
	boom := errors.New("boom")
	ln := listen(t)
	servers := []Server{HTTP("http", ln, http.NotFoundHandler(), discard), failing{boom}}
	if err := Serve(t.Context(), discard, servers); !errors.Is(err, boom) {
		t.Fatalf("Serve = %v, want the failing server's error", err)
	}
	if err := Drain(t.Context(), servers); err != nil {
		t.Fatalf("drain after a failure: %v", err)
	}
}

// TestCloseReleasesListenersThatNeverServed.
func TestCloseReleasesListenersThatNeverServed(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	Close([]Server{HTTP("http", ln, http.NotFoundHandler(), discard)})
	again, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("address still held after Close: %v", err)
	}
	again.Close()
}
