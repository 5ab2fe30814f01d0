package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/security/pki"
)

// TestRouterCertificate: a router holding a router certificate (idemctl
// cert create-router) is a forwarding peer of the nodes' gRPC port (the
// principal it forwards is the one the nodes judge: bob may write his
// namespace and not delete in another), and its certificate opens no Raft
// connection: the node closes it at the handshake and counts it. A router
// given a node certificate, as in v1.1, still works and warns at start.
func TestRouterCertificate(t *testing.T) {
	c := newRootBobRegion(t, "rcert")
	topo, dir := c.Topology, c.Dir
	region := topo.Regions[0].Name
	edge, err := c.NewRouter(binaries.Path(t, "idemrouter"), "edge", region)
	if err != nil {
		t.Fatal(err)
	}
	c.RouterNodeCerts = true
	legacy, err := c.NewRouter(binaries.Path(t, "idemrouter"), "legacy", region)
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*cluster.Router{edge, legacy} {
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*cluster.Router{edge, legacy} {
		if err := r.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "certs", "edge", pki.NodeCertFile)); err == nil {
		t.Fatal("the edge router's certs dir holds a node certificate")
	}

	bob := must2(c.API(edge.HTTPAddr, "bob"))
	if res, err := bob.Reserve(ctx, "bob", "k1", nil); err != nil || res.Str("outcome") != "ACQUIRED" {
		t.Fatalf("bob reserving through the router with a router certificate: %v %v", res, err)
	}
	if res, err := bob.Do(ctx, "DELETE", cluster.KeyPath("bob", "k1"), map[string]any{"reason": "bob"}); err != nil || res.Status != 403 {
		t.Fatalf("bob (a writer) deleting through the router: %v %v, want 403 from the nodes", res, err)
	}
	root := must2(c.API(edge.HTTPAddr, "root"))
	if res, err := root.Do(ctx, "DELETE", cluster.KeyPath("bob", "k1"), map[string]any{"reason": "cleanup"}); err != nil || res.Status != 200 {
		t.Fatalf("root deleting through the router: %v %v", res, err)
	}
	legacyRoot := must2(c.API(legacy.HTTPAddr, "root"))
	if res, err := legacyRoot.Reserve(ctx, "pay", "k2", nil); err != nil || res.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve through the router with a node certificate: %v %v", res, err)
	}
	pollLog(t, legacy.Process, "this router presents a node certificate")
	if data, _ := os.ReadFile(edge.Process.Log); bytes.Contains(data, []byte("presents a node certificate")) {
		t.Fatal("the router with a router certificate warned about a node certificate")
	}
	// The node logged the delete with the principal the router forwarded.
	found := false
	for _, n := range c.Nodes {
		data, _ := os.ReadFile(n.Log)
		if bytes.Contains(data, []byte("principal=root namespace=bob key=k1 reason=cleanup")) {
			found = true
		}
	}
	if !found {
		t.Fatal("no node logged root's delete forwarded by the router")
	}

	// The router's certificate on a node's Raft port: closed at the
	// handshake, counted as a TLS rejection.
	routerCert, err := tls.LoadX509KeyPair(filepath.Join(dir, "certs", "edge", pki.RouterCertFile), filepath.Join(dir, "certs", "edge", pki.RouterKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	node := topo.Regions[0].Nodes[0]
	nodeAPI := must2(c.API(node.HTTPAddr, "root"))
	before := raftRejected(t, nodeAPI)
	shard := region + "-0"
	hdr := append([]byte("IDRM\x01"), byte(len(shard)))
	hdr = append(hdr, shard...)
	expectClosed(t, "router certificate", func() (net.Conn, error) {
		return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", node.RaftAddr,
			&tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{routerCert}})
	}, hdr)
	deadline := time.Now().Add(10 * time.Second)
	for raftRejected(t, nodeAPI) < before+1 {
		if time.Now().After(deadline) {
			t.Fatalf("idem_raft_rejected_connections_total{reason=\"tls\"} went from %v to %v, want +1", before, raftRejected(t, nodeAPI))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
