package transport

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestConnGate: a connection idle without authenticating is closed after
// the timeout; an authenticated one is not; one busy with a request is not
// cut, and gets a new period once idle.
func TestConnGate(t *testing.T) {
	const timeout = 100 * time.Millisecond
	closed := prometheus.NewCounter(prometheus.CounterOpts{Name: "c"})
	g := newConnGate(timeout, closed)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := g.listener(raw)
	defer ln.Close()
	accept := func() (client, server net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, s
	}
	// open reports whether the server side still holds the connection:
	// a read on the client side sees EOF once the server closed it.
	open := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
	}

	idleC, _ := accept()
	authC, authS := accept()
	g.markAddr(authS.RemoteAddr().String())
	busyC, busyS := accept()
	g.connState(busyS, http.StateActive)

	time.Sleep(3 * timeout)
	if open(idleC) {
		t.Error("a connection idle without authenticating is still open past the timeout")
	}
	if !open(authC) {
		t.Error("an authenticated connection was closed")
	}
	if !open(busyC) {
		t.Error("a connection busy with a request was cut")
	}
	g.connState(busyS, http.StateIdle)
	time.Sleep(3 * timeout)
	if open(busyC) {
		t.Error("a connection idle again, never authenticated, is still open past the timeout")
	}
	if _, err := busyC.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read on a closed connection: %v, want EOF", err)
	}
}
