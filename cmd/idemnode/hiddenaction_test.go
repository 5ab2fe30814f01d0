package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/launch"
)

// An operator action cannot be hidden: a client that sends idem-hops (the
// forwarding hop count only idem's own processes send each other) with a
// ForceRelease to a secure node is treated as the client it is. Before,
// the node took such an action as forwarded: applied, logged at DEBUG only
// and not counted in idem_operator_actions_total.
func TestOperatorActionCannotBeHiddenAsForwarded(t *testing.T) {
	c := startSecureCluster(t, launch.Spec{Cluster: "hide", Regions: []string{"east"}, NodesPerRegion: 1, ShardsPerRegion: 1, Replicas: 1},
		"principals:\n  - {name: root, namespaces: [\"*\"], role: admin}\n", "root")
	topo := c.Topology
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	node := topo.Nodes()[0]
	api, err := c.API(node.HTTPAddr, "root")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := api.Reserve(ctx, "pay", "order-1", nil); err != nil || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve: %v %v", r, err)
	}

	tlsCfg, err := c.ClientTLS("root")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(node.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hidden := metadata.AppendToOutgoingContext(ctx, idemv1.HopsHeader, "1")
	if _, err := idemv1.NewAdminClient(conn).ForceRelease(hidden, &idemv1.ForceReleaseRequest{Namespace: "pay", Key: "order-1", Reason: "hidden"}); err != nil {
		t.Fatalf("force-release: %v", err)
	}

	data, _ := os.ReadFile(c.Nodes[node.ID].Log)
	line := regexp.MustCompile(`(?m)^.*level=INFO msg="operator action" .*action=force_release principal=root namespace=pay key=order-1 reason=hidden outcome=OK.*$`).Find(data)
	if line == nil {
		t.Fatalf("the node did not log the force-release at INFO:\n%s", data)
	}
	if bytes.Contains(line, []byte("hops=")) {
		t.Fatalf("the client's idem-hops was honoured: %s", line)
	}
	m, err := api.Do(ctx, "GET", "/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := `idem_operator_actions_total{action="force_release",forwarded="false",outcome="OK"} 1`; !bytes.Contains(m.Raw, []byte(want+"\n")) {
		t.Fatalf("the metrics lack %s:\n%s", want, regexp.MustCompile(`(?m)^idem_operator_actions_total.*$`).FindAll(m.Raw, -1))
	}
}
