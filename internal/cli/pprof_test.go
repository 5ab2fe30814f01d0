package cli

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestServePprof(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	addr, err := ServePprof(ctx, "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("goroutine profile: %s\n%.300s", resp.Status, body)
	}
	cancel()
	// Once ctx ends the listener closes: poll until a request fails.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr.String() + "/debug/pprof/")
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("pprof still served 10s after its context ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := ServePprof(t.Context(), "256.0.0.1:1", slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Error("ServePprof on an invalid address succeeded")
	}
}
