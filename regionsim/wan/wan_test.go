package wan

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers every line with the same line and counts the lines it
// received.
func echoServer(t *testing.T) (addr string, received *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	received = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					received.Add(1)
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), received
}

func newNet(t *testing.T, l Link) *Network {
	t.Helper()
	n, err := New(Config{Regions: []string{"a", "b", "c"}, Default: l, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestLatencyIsAddedBothWays(t *testing.T) {
	target, _ := echoServer(t)
	n := newNet(t, Link{Latency: 40 * time.Millisecond, Jitter: 5 * time.Millisecond})
	addr, err := n.Listen("a", "b", target)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for i := 0; i < 3; i++ {
		start := time.Now()
		got, err := roundTrip(c, r, "ping", 5*time.Second)
		if err != nil || got != "ping" {
			t.Fatalf("round trip: %q %v", got, err)
		}
		// A lower bound only: two crossings of a link of at least 35 ms.
		if rtt := time.Since(start); rtt < 70*time.Millisecond {
			t.Fatalf("round trip took %s, less than two one-way delays of >= 35ms", rtt)
		}
	}
}

func TestSameRegionIsDirect(t *testing.T) {
	target, _ := echoServer(t)
	n := newNet(t, Link{Latency: time.Minute})
	addr, err := n.Listen("a", "a", target)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Through the default link a round trip takes two minutes; the timeout
	// is far below that and far above any loopback stall on a loaded box.
	if got, err := roundTrip(c, bufio.NewReader(c), "x", 20*time.Second); err != nil || got != "x" {
		t.Fatalf("in-region round trip: %q %v", got, err)
	}
}

func TestRefuseResetsOpenAndNewConnections(t *testing.T) {
	target, _ := echoServer(t)
	n := newNet(t, Link{Latency: time.Millisecond})
	addr, _ := n.Listen("a", "b", target)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(c, r, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Cutting only b->a refuses too: a TCP connection needs both ways.
	if err := n.SetCut("b", "a", Refuse); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, r, "during", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("open connection across a refused link: got %v, want a reset", err)
	}
	c2, err := net.Dial("tcp", addr)
	if err == nil {
		_, err = roundTrip(c2, bufio.NewReader(c2), "new", 5*time.Second)
		c2.Close()
	}
	if err == nil || isTimeout(err) {
		t.Fatalf("new connection across a refused link: got %v, want a reset", err)
	}
	n.HealAll()
	c3, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if got, err := roundTrip(c3, bufio.NewReader(c3), "after", 5*time.Second); err != nil || got != "after" {
		t.Fatalf("after heal: %q %v", got, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

func TestBlackholeHoldsUntilHealed(t *testing.T) {
	target, received := echoServer(t)
	n := newNet(t, Link{Latency: time.Millisecond})
	addr, _ := n.Listen("a", "b", target)
	if err := n.Isolate("b", Blackhole); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr) // accepted: a blackhole does not refuse
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(c, r, "held", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("across a blackhole: got %v, want a timeout", err)
	}
	if received.Load() != 0 {
		t.Fatal("the server received a line sent into a blackhole")
	}
	n.HealAll()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "held" {
		t.Fatalf("after heal the held line should arrive intact: %q %v", line, err)
	}
}

// TestAsymmetricCut: with only the answer direction blackholed, the request
// is applied but its answer never arrives.
func TestAsymmetricCut(t *testing.T) {
	target, received := echoServer(t)
	n := newNet(t, Link{Latency: time.Millisecond})
	addr, _ := n.Listen("a", "b", target)
	if err := n.SetCut("b", "a", Blackhole); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := roundTrip(c, bufio.NewReader(c), "applied", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("got %v, want a timeout", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for received.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the request did not reach the server across the open direction")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := n.ActiveCuts(); len(got) != 1 || got[0] != "b->a blackhole" {
		t.Fatalf("ActiveCuts = %v", got)
	}
}

func TestLossDelaysButNeverCorrupts(t *testing.T) {
	target, _ := echoServer(t)
	n := newNet(t, Link{Latency: time.Millisecond, Loss: 0.5, LossPenalty: 20 * time.Millisecond})
	addr, _ := n.Listen("a", "c", target)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for i := 0; i < 20; i++ {
		msg := strings.Repeat("z", i+1)
		if got, err := roundTrip(c, r, msg, 5*time.Second); err != nil || got != msg {
			t.Fatalf("lossy round trip %d: %q %v", i, got, err)
		}
	}
	if n.Stats().Lost.Load() == 0 {
		t.Fatal("with 50% loss over 40 chunks no chunk paid the penalty")
	}
}

func TestHalfCloseKeepsAnswerDirection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		data, _ := io.ReadAll(c) // until the client's half-close
		c.Write([]byte(strings.ToUpper(string(data))))
	}()
	n := newNet(t, Link{Latency: 2 * time.Millisecond})
	addr, _ := n.Listen("a", "b", ln.Addr().String())
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	c.(*net.TCPConn).CloseWrite()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "HELLO" {
		t.Fatalf("got %q %v", got, err)
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{Regions: []string{"a", "a", ""}, Default: Link{Latency: -1, Loss: 2}, MaxBuffered: -1}.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"repeated", "negative", "outside 0..1", "MaxBuffered"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	n := newNet(t, Link{})
	if err := n.SetCut("a", "zz", Refuse); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("SetCut to unknown region: %v", err)
	}
}

// TestAddRegion: a region declared while the network runs gets proxies and
// cuts like the others, and Isolate of an old region reaches it too.
func TestAddRegion(t *testing.T) {
	target, _ := echoServer(t)
	n := newNet(t, Link{Latency: time.Millisecond})
	if _, err := n.Listen("d", "a", target); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("Listen from an undeclared region: %v", err)
	}
	if err := n.AddRegion("d"); err != nil {
		t.Fatal(err)
	}
	if err := n.AddRegion("d"); err == nil {
		t.Fatal("the same region added twice")
	}
	addr, err := n.Listen("d", "a", target)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if got, err := roundTrip(c, r, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("from the added region: %q %v", got, err)
	}
	if err := n.Isolate("a", Refuse); err != nil {
		t.Fatal(err)
	}
	if n.CutOf("d", "a") != Refuse || n.CutOf("a", "d") != Refuse {
		t.Fatalf("isolating a left the added region's links up: %v", n.ActiveCuts())
	}
	if _, err := roundTrip(c, r, "cut", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("across the refused link to the added region: got %v, want a reset", err)
	}
}
