package main

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
)

// TestSlowClientsAreCutOff: 200 connections that sent their headers and one
// byte of a body hold the node only until --http-read-timeout; a normal
// request is answered meanwhile, and every slow connection is closed.
func TestSlowClientsAreCutOff(t *testing.T) {
	httpAddr, _ := startDev(t, nil, "--http-read-timeout", "2s")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	const slow = 200
	conns := make([]net.Conn, 0, slow)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range slow {
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, "POST /v1/namespaces/slow/keys/k:reserve HTTP/1.1\r\nHost: idem\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
			t.Fatal(err)
		}
	}
	// A normal caller is served while the slow ones hang on.
	r, err := cluster.NewAPI(httpAddr).Reserve(ctx, "fast", "k", map[string]any{})
	if err != nil || r.Status != 200 {
		t.Fatalf("normal request next to %d slow ones: %v %v", slow, r, err)
	}
	// Every slow connection is closed by the server (an answer, if any,
	// then EOF), well before the test's own 20 s bound.
	deadline := time.Now().Add(20 * time.Second)
	for i, c := range conns {
		c.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("slow connection %d not closed by the server: %v", i, err)
		}
	}
	if r, err := cluster.NewAPI(httpAddr).Get(ctx, "fast", "k"); err != nil || r.Status != 200 {
		t.Fatalf("after the slow clients: %v %v", r, err)
	}
}
