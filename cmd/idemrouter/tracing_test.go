package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/topology"
)

// otlpSpan is one exported span as the receiver decoded it.
type otlpSpan struct {
	service, instance string // resource: service.name, service.instance.id
	traceID, id       string // hex
	parent            string // hex; "" for a root
	name              string
	kind              tracepb.Span_SpanKind
	attrs             map[string]string
	links             int
}

func (s otlpSpan) String() string {
	return fmt.Sprintf("%s[%s %s] %s parent=%s attrs=%v", s.name, s.service, s.instance, s.id, s.parent, s.attrs)
}

// otlpReceiver is an OTLP/HTTP trace endpoint (POST /v1/traces,
// protobuf) that keeps every span it is sent.
type otlpReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	spans    []otlpSpan
	requests int
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("OTLP receiver: %s %s (%s), want POST /v1/traces in protobuf", req.Method, req.URL.Path, req.Header.Get("Content-Type"))
			http.Error(w, "unexpected", http.StatusBadRequest)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		data, err := io.ReadAll(body)
		var export coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(data, &export)
		}
		if err != nil {
			t.Errorf("OTLP receiver: undecodable export request: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&export)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

func attrString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	}
	return v.String()
}

func (r *otlpReceiver) add(export *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	for _, rs := range export.GetResourceSpans() {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.GetKey()] = attrString(kv.GetValue())
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := otlpSpan{service: res["service.name"], instance: res["service.instance.id"],
					traceID: hex.EncodeToString(sp.GetTraceId()), id: hex.EncodeToString(sp.GetSpanId()),
					parent: hex.EncodeToString(sp.GetParentSpanId()), name: sp.GetName(), kind: sp.GetKind(),
					attrs: map[string]string{}, links: len(sp.GetLinks())}
				for _, kv := range sp.GetAttributes() {
					s.attrs[kv.GetKey()] = attrString(kv.GetValue())
				}
				r.spans = append(r.spans, s)
			}
		}
	}
}

func (r *otlpReceiver) all() []otlpSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans)
}

// traceparentTransport sends a fixed W3C traceparent with every request,
// as an application with an active span would.
type traceparentTransport struct{ traceparent string }

func (tt traceparentTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("traceparent", tt.traceparent)
	return http.DefaultTransport.RoundTrip(req)
}

const (
	traceTestID     = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceTestParent = "00f067aa0ba902b7"
)

// A reserve and a complete sent through the router with a traceparent
// come back as one trace: the router's API span (a child of the caller's),
// its forward to a node that does not lead the key's shard, that node's
// API span and forward to the leader, the leader's API span and its Raft
// proposal with commit and apply, each the child of the one before. With
// sampling off the same calls export nothing.
func TestTraceThroughRouterToLeader(t *testing.T) {
	recv := newOTLPReceiver(t)
	topo, err := launch.Topology(launch.Spec{Cluster: "trace", Regions: []string{"us-east"}, NodesPerRegion: 3, ShardsPerRegion: 1, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.NewNodes(topo, t.TempDir(), binaries.Path(t, "idemnode"), "--otlp-endpoint", recv.URL)
	if err != nil {
		t.Fatal(err)
	}
	// Proxy mode too: the upstream records the traceparent it is sent.
	var upstreamSeen sync.Map // traceparent -> true
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamSeen.Store(r.Header.Get("traceparent"), true)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	t.Cleanup(upstream.Close)
	ports, err := launch.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	rt, err := c.NewRouter(binaries.Path(t, "idemrouter"), "router-us-east", "us-east", "--otlp-endpoint", recv.URL,
		"--upstream", upstream.URL, "--proxy-addr", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	setEnv := func(env ...string) {
		for _, p := range c.Nodes {
			p.Env = env
		}
		rt.Env = env
	}
	setEnv("OTEL_BSP_SCHEDULE_DELAY=50")
	t.Cleanup(func() {
		c.StopAll()
		if t.Failed() {
			c.LogTails(t)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	ring, err := topology.NewRing(topo)
	if err != nil {
		t.Fatal(err)
	}
	const namespace, key = "payments", "order-42"
	shard := ring.Locate(namespace, key)
	// The router tries the shard's first voter first: its leader must be
	// another node, so that the call takes the node -> leader hop too.
	leader := leaderOtherThan(ctx, t, c, topo, shard, shard.Voters[0])
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	api := rt.API()
	api.Client = &http.Client{Transport: traceparentTransport{"00-" + traceTestID + "-" + traceTestParent + "-01"}}
	owner := reserveAndComplete(ctx, t, api, namespace, key)

	// Every span of the two calls is in the trace, with its parent.
	var spans []otlpSpan
	deadline := time.Now().Add(20 * time.Second)
	for {
		spans = spansOf(recv.all(), traceTestID)
		if chainErr(spans, "reserve", shard.Voters[0], leader) == nil && chainErr(spans, "complete", "", leader) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s incomplete after 20s: reserve: %v; complete: %v\nspans:\n%s", traceTestID,
				chainErr(spans, "reserve", shard.Voters[0], leader), chainErr(spans, "complete", "", leader), spanList(spans))
		}
		time.Sleep(50 * time.Millisecond) // poll interval of the deadline loop
	}
	// Through the proxy: the upstream gets the caller's trace, and the
	// proxy's span continues it, with the store's forwards under it.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxyAddr+"/charges", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Idempotency-Key", "proxy-key-1")
	req.Header.Set("traceparent", "00-"+traceTestID+"-"+traceTestParent+"-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("proxied POST: %d", resp.StatusCode)
	}
	upstreamTrace := false
	upstreamSeen.Range(func(k, _ any) bool {
		tp := k.(string)
		upstreamTrace = upstreamTrace || (strings.HasPrefix(tp, "00-"+traceTestID+"-") && !strings.Contains(tp, traceTestParent))
		return true
	})
	if !upstreamTrace {
		t.Errorf("the upstream got no traceparent of the caller's trace (with the proxy's span as parent)")
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		err := proxyChainErr(spansOf(recv.all(), traceTestID))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy spans: %v\nspans:\n%s", err, spanList(spansOf(recv.all(), traceTestID)))
		}
		time.Sleep(50 * time.Millisecond) // poll interval of the deadline loop
	}

	for _, s := range recv.all() {
		for k, v := range s.attrs {
			if strings.Contains(v, key) || strings.Contains(v, owner) || strings.Contains(v, "proxy-key-1") {
				t.Errorf("span %s carries the key or owner token in %s=%q (no --trace-keys)", s, k, v)
			}
		}
	}
	t.Logf("%d spans in trace %s", len(spans), traceTestID)

	// Sampling off: the same calls, then a clean stop (which flushes what
	// is queued), export nothing.
	if err := c.StopAll(); err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	recv.spans, recv.requests = nil, 0
	recv.mu.Unlock()
	setEnv("OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_TRACES_SAMPLER=always_off")
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	reserveAndComplete(ctx, t, api, namespace, "order-43")
	if err := c.StopAll(); err != nil {
		t.Fatal(err)
	}
	if got := recv.all(); len(got) != 0 {
		t.Errorf("sampling off: %d spans exported:\n%s", len(got), spanList(got))
	}
}

// reserveAndComplete reserves key and completes it; it returns the owner
// token.
func reserveAndComplete(ctx context.Context, t *testing.T, api *cluster.API, namespace, key string) string {
	t.Helper()
	r, err := cluster.Decided(ctx, func() (cluster.Reply, error) {
		return api.Reserve(ctx, namespace, key, map[string]any{"lease_ms": 60000})
	})
	if err != nil || r.Status != http.StatusOK || r.Str("outcome") != "ACQUIRED" {
		t.Fatalf("reserve: %v %v", r, err)
	}
	owner := r.Str("owner_token")
	c, err := api.Complete(ctx, namespace, key, completeBody(owner, "paid"))
	if err != nil || c.Status != http.StatusOK {
		t.Fatalf("complete: %v %v", c, err)
	}
	return owner
}

// leaderOtherThan makes sure that a node other than not leads shard (a
// leadership transfer when needed) and returns it.
func leaderOtherThan(ctx context.Context, t *testing.T, c *cluster.Cluster, topo *topology.Topology, shard topology.Shard, not string) string {
	t.Helper()
	for {
		leaders, err := c.ShardLeaders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leader := leaders[shard.ID]
		if leader != "" && leader != not {
			return leader
		}
		if leader == not {
			n, _ := topo.NodeByID(leader)
			conn, err := grpc.NewClient(n.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			_, err = idemv1.NewAdminClient(conn).TransferLeader(ctx, &idemv1.TransferLeaderRequest{Shard: shard.ID, TargetNodeId: shard.Voters[1]})
			conn.Close()
			if err != nil {
				t.Logf("transfer leadership of %s: %v", shard.ID, err)
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("shard %s: no leader other than %s (last: %q)", shard.ID, not, leader)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}

func spansOf(all []otlpSpan, traceID string) []otlpSpan {
	var out []otlpSpan
	for _, s := range all {
		if s.traceID == traceID {
			out = append(out, s)
		}
	}
	return out
}

func spanList(spans []otlpSpan) string {
	var b bytes.Buffer
	for _, s := range spans {
		fmt.Fprintln(&b, " ", s)
	}
	return b.String()
}

// chainErr checks the path of one call (op: reserve or complete) in
// spans, from the leader's Raft apply up to the caller's span: nil when
// every step is there with the right parent. via, when set, is the node
// the router reached first, which forwarded to leader.
func chainErr(spans []otlpSpan, op, via, leader string) error {
	byID := map[string]otlpSpan{}
	for _, s := range spans {
		byID[s.id] = s
	}
	// The router's API span for op, a child of the caller's span.
	var top *otlpSpan
	for _, s := range spans {
		if s.service == "idemrouter" && s.name == "idem.http "+op {
			top = &s
			break
		}
	}
	if top == nil {
		return fmt.Errorf("no router span idem.http %s", op)
	}
	if top.parent != traceTestParent {
		return fmt.Errorf("router span %s: parent %s, want the caller's %s", top, top.parent, traceTestParent)
	}
	if top.attrs["idem.namespace"] != "payments" || top.attrs["idem.operation"] != op || top.attrs["idem.outcome"] == "" {
		return fmt.Errorf("router span %s lacks namespace, operation or outcome", top)
	}
	children := func(parent otlpSpan, name, service, instance string) (otlpSpan, error) {
		for _, s := range spans {
			if s.parent == parent.id && s.name == name && (service == "" || s.service == service) && (instance == "" || s.instance == instance) {
				return s, nil
			}
		}
		return otlpSpan{}, fmt.Errorf("no span %s (%s %s) under %s", name, service, instance, parent)
	}
	method := "idem.v1.Idempotency/" + strings.ToUpper(op[:1]) + op[1:]
	// hop follows one forward: the forward span on from (a node id, or
	// "" for the router) to target, its gRPC client span, and the target's
	// server span.
	hop := func(parent otlpSpan, fromService, target string) (otlpSpan, error) {
		fwd, err := children(parent, "idem.forward", fromService, "")
		if err != nil {
			return fwd, err
		}
		if target != "" && fwd.attrs["idem.node"] != target {
			return fwd, fmt.Errorf("forward %s goes to %s, want %s", fwd, fwd.attrs["idem.node"], target)
		}
		client, err := children(fwd, method, fromService, "")
		if err != nil {
			return client, err
		}
		if client.kind != tracepb.Span_SPAN_KIND_CLIENT {
			return client, fmt.Errorf("span %s is not a client span", client)
		}
		srv, err := children(client, method, "idemnode", fwd.attrs["idem.node"])
		if err != nil {
			return srv, err
		}
		if srv.kind != tracepb.Span_SPAN_KIND_SERVER || srv.attrs["idem.operation"] != op || srv.attrs["idem.namespace"] != "payments" {
			return srv, fmt.Errorf("server span %s: want a server span with operation %s and namespace", srv, op)
		}
		return srv, nil
	}
	first := via
	if first == "" {
		first = leader
	}
	at, err := hop(*top, "idemrouter", first)
	if err != nil {
		return err
	}
	if at.instance != leader {
		if at, err = hop(at, "idemnode", leader); err != nil {
			return err
		}
	}
	if via != "" && via == leader {
		return fmt.Errorf("via %s is the leader", via)
	}
	propose, err := children(at, "raft.propose", "idemnode", leader)
	if err != nil {
		return err
	}
	if propose.attrs["idem.shard"] == "" || propose.attrs["raft.index"] == "" || propose.attrs["raft.commit_ms"] == "" {
		return fmt.Errorf("raft.propose %s lacks shard, index or commit time", propose)
	}
	for _, name := range []string{"raft.commit", "raft.apply"} {
		if _, err := children(propose, name, "idemnode", leader); err != nil {
			return err
		}
	}
	return nil
}

// proxyChainErr checks the proxy's part of the trace: its server span, a
// child of the caller's, with a forward of the store's reserve and the
// upstream request's client span under it.
func proxyChainErr(spans []otlpSpan) error {
	var srv *otlpSpan
	for _, s := range spans {
		if s.service == "idemrouter" && s.name == "idem.proxy POST" {
			srv = &s
			break
		}
	}
	if srv == nil {
		return fmt.Errorf("no idem.proxy POST span")
	}
	if srv.parent != traceTestParent || srv.kind != tracepb.Span_SPAN_KIND_SERVER {
		return fmt.Errorf("proxy span %s: want a server span whose parent is the caller's %s", srv, traceTestParent)
	}
	var forward, upstream bool
	for _, s := range spans {
		if s.parent == srv.id && s.name == "idem.forward" {
			forward = true
		}
		if s.parent == srv.id && s.kind == tracepb.Span_SPAN_KIND_CLIENT && s.attrs["http.request.method"] == "POST" {
			upstream = true
		}
	}
	if !forward || !upstream {
		return fmt.Errorf("under the proxy span: a forward %v, the upstream request %v; want both", forward, upstream)
	}
	return nil
}
