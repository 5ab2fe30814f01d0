package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/testutil"
)

// Connection slots cannot be held without credentials: with --max-conns 8,
// eight idle keep-alive connections that made one unauthenticated request
// (a probe) fill the JSON listener, and eight silent TCP connections the
// gRPC listener. Before, they held every slot for two minutes (the idle
// timeout and gRPC's handshake timeout), so a real caller waited that long;
// now a connection idle without having authenticated a request is closed
// after 10 s, and the real callers get through.
func TestIdleUnauthenticatedConnectionsHoldNoSlot(t *testing.T) {
	const slots = 8
	httpAddr, p := startDev(t, nil, "--max-conns", fmt.Sprint(slots))
	grpcAddr := flagValue(p, "--grpc-addr")

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range slots {
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: idem\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // the connection stays open, idle
		g, err := net.Dial("tcp", grpcAddr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, g) // silent: not even HTTP/2's preface
	}
	start := time.Now()

	// A real caller on each listener, on a new connection, gets through
	// once the idle unauthenticated ones are closed (10 s), long before
	// the two minutes they held the slots for.
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	api := cluster.NewAPI(httpAddr)
	api.Client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if r, err := api.Reserve(ctx, "slots", "k1", nil); err != nil || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("a JSON reserve behind %d idle unauthenticated connections: %v %v", slots, r, err)
	}
	t.Logf("JSON reserve answered after %s", time.Since(start).Round(time.Millisecond))
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if r, err := idemv1.NewIdempotencyClient(conn).Reserve(ctx, &idemv1.ReserveRequest{Namespace: "slots", Key: "k2"}, grpc.WaitForReady(true)); err != nil || r.GetOutcome() != idemv1.Outcome_ACQUIRED {
		t.Fatalf("a gRPC reserve behind %d silent connections: %v %v", slots, r, err)
	}
	t.Logf("gRPC reserve answered after %s", time.Since(start).Round(time.Millisecond))
	// The gate closed at least the idle keep-alives; the silent gRPC
	// connections may go by gRPC's own 10 s handshake deadline first.
	testutil.Until(t, 10*time.Second, fmt.Sprintf("idem_unauthenticated_connections_closed_total >= %d", slots), func() bool {
		n, err := cluster.MetricSum(ctx, httpAddr, "idem_unauthenticated_connections_closed_total")
		return err == nil && n >= slots
	})
}
