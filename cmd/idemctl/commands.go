package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/topology"
)

// checkName validates a namespace and key the way the API does, so a typo
// gets a clear message rather than a location for a key nobody can store.
func checkName(namespace, key string) error {
	var errs []error
	if !contract.ValidNamespace(namespace) {
		errs = append(errs, fmt.Errorf("namespace %q must match %s", namespace, contract.NameGrammar))
	}
	switch v := contract.CheckKey(key); {
	case v == nil:
	case v.Fault == contract.FaultByte:
		errs = append(errs, fmt.Errorf("key byte %d (%q) is not printable ASCII (0x21-0x7E)", v.Pos, v.Byte))
	default:
		errs = append(errs, fmt.Errorf("a key is 1 to %d bytes, got %d", contract.MaxKeyBytes, v.Len))
	}
	return errors.Join(errs...)
}

// keyValues prints rows of name and value, aligned.
func keyValues(w io.Writer, rows [][2]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	tw.Flush()
}

// locateView is what locate prints.
type locateView struct {
	Namespace  string   `json:"namespace"`
	Key        string   `json:"key"`
	Shard      string   `json:"shard"`
	HomeRegion string   `json:"home_region"`
	Voters     []string `json:"voters"`
	// Leader is "" when no voter answered with one.
	Leader string `json:"leader"`
	Term   uint64 `json:"term"`
	// Unreachable lists the voters that did not answer.
	Unreachable []string `json:"unreachable"`
}

func runLocate(ctx context.Context, e *env, args []string) error {
	topo, err := e.needTopology("locate")
	if err != nil {
		return err
	}
	ns, key := args[0], args[1]
	if err := checkName(ns, key); err != nil {
		return err
	}
	ring, err := topology.NewRing(topo)
	if err != nil {
		return err
	}
	shard := ring.Locate(ns, key)
	sv := findLeader(ctx, e, shard)
	v := locateView{Namespace: ns, Key: key, Shard: shard.ID, HomeRegion: shard.HomeRegion, Voters: shard.Voters,
		Leader: sv.Leader, Term: sv.Term, Unreachable: []string{}}
	for _, r := range sv.Replicas {
		if !r.Reachable {
			v.Unreachable = append(v.Unreachable, r.Node)
		}
	}
	if e.g.json {
		return writeJSON(e.stdout, v)
	}
	leader := "none known (no voter answered with a leader)"
	if v.Leader != "" {
		leader = fmt.Sprintf("%s (term %d)", v.Leader, v.Term)
	}
	rows := [][2]string{
		{"namespace", ns}, {"key", key}, {"shard", v.Shard}, {"home region", v.HomeRegion},
		{"voters", strings.Join(v.Voters, ", ")}, {"leader", leader},
	}
	if len(v.Unreachable) > 0 {
		rows = append(rows, [2]string{"unreachable", strings.Join(v.Unreachable, ", ")})
	}
	keyValues(e.stdout, rows)
	return nil
}

// recordView is the JSON of get: the JSON API's GET body.
type recordView struct {
	State          string        `json:"state"`
	Fingerprint    string        `json:"fingerprint"`
	FencingToken   string        `json:"fencing_token"`
	LeaseExpiresAt string        `json:"lease_expires_at,omitempty"`
	CompletedAt    string        `json:"completed_at,omitempty"`
	ExpiresAt      string        `json:"expires_at,omitempty"`
	Response       *responseView `json:"response,omitempty"`
}

type responseView struct {
	Status  int32             `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    []byte            `json:"body"` // base64, as in the JSON API
}

func timeString(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

func runGet(ctx context.Context, e *env, args []string) error {
	ns, key := args[0], args[1]
	if err := checkName(ns, key); err != nil {
		return err
	}
	var addrs []string
	if e.o.addr != "" {
		addrs = []string{e.o.addr}
	} else {
		topo, err := e.needTopology("get without --addr")
		if err != nil {
			return err
		}
		ring, err := topology.NewRing(topo)
		if err != nil {
			return err
		}
		shard := ring.Locate(ns, key)
		for _, id := range shard.Voters {
			n, _ := topo.NodeByID(id)
			addrs = append(addrs, n.GRPCAddr)
		}
		for _, n := range topo.Nodes() {
			if !shard.HasVoter(n.ID) {
				addrs = append(addrs, n.GRPCAddr)
			}
		}
	}
	var resp *idemv1.GetResponse
	var tried []string
	for _, addr := range addrs {
		conn, err := e.dial(addr)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, e.g.timeout)
		resp, err = idemv1.NewIdempotencyClient(conn).Get(cctx, &idemv1.GetRequest{Namespace: ns, Key: key})
		cancel()
		conn.Close()
		if err == nil {
			break
		}
		switch status.Code(err) {
		case codes.NotFound:
			return fmt.Errorf("no record for key %q in namespace %q (never reserved, released, or past retention)", key, ns)
		case codes.InvalidArgument:
			return fmt.Errorf("get: %s", status.Convert(err).Message())
		}
		tried = append(tried, addr+": "+reason(err))
		if ctx.Err() != nil {
			break
		}
	}
	if resp == nil {
		return fmt.Errorf("could not read the key from any of %d address(es): %s", len(addrs), strings.Join(tried, "; "))
	}
	v := recordView{Fingerprint: resp.GetFingerprint(), FencingToken: strconv.FormatUint(resp.GetFencingToken(), 10),
		LeaseExpiresAt: timeString(resp.GetLeaseExpiresAt()), CompletedAt: timeString(resp.GetCompletedAt()), ExpiresAt: timeString(resp.GetExpiresAt())}
	v.State = stateName(resp.GetState())
	if r := resp.GetResponse(); r != nil {
		v.Response = &responseView{Status: r.GetStatus(), Headers: r.GetHeaders(), Body: r.GetBody()}
		if v.Response.Headers == nil {
			v.Response.Headers = map[string]string{}
		}
	}
	if e.g.json {
		return writeJSON(e.stdout, v)
	}
	rows := [][2]string{{"state", v.State}, {"fingerprint", v.Fingerprint}, {"fencing token", v.FencingToken}}
	for _, t := range [][2]string{{"lease expires at", v.LeaseExpiresAt}, {"completed at", v.CompletedAt}, {"expires at", v.ExpiresAt}} {
		if t[1] != "" {
			rows = append(rows, t)
		}
	}
	if r := v.Response; r != nil {
		rows = append(rows, [2]string{"response status", strconv.Itoa(int(r.Status))})
		names := make([]string, 0, len(r.Headers))
		for name := range r.Headers {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			rows = append(rows, [2]string{"header", name + ": " + r.Headers[name]})
		}
		rows = append(rows, [2]string{"body", bodyText(r.Body)})
	}
	keyValues(e.stdout, rows)
	return nil
}

// bodyText shows a body as text when it is printable UTF-8 on one line,
// else as base64.
func bodyText(b []byte) string {
	if len(b) == 0 {
		return "(empty)"
	}
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return string(b)
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b)
}

// reason is a short, readable cause of a failed call.
func reason(err error) string {
	msg := status.Convert(err).Message()
	switch {
	case strings.Contains(msg, "connection refused"):
		return "connection refused"
	case status.Code(err) == codes.DeadlineExceeded:
		return "timed out"
	}
	return msg
}

// shardArg looks up the shard named on the command line.
func shardArg(topo *topology.Topology, id string) (topology.Shard, error) {
	s, ok := topo.ShardByID(id)
	if !ok {
		var ids []string
		for _, s := range topo.Shards() {
			ids = append(ids, s.ID)
		}
		return topology.Shard{}, fmt.Errorf("no shard %q in cluster %q (shards: %s)", id, topo.Cluster, strings.Join(ids, ", "))
	}
	return s, nil
}

func adminClient(e *env, topo *topology.Topology, nodeID string) (idemv1.AdminClient, func(), error) {
	n, _ := topo.NodeByID(nodeID)
	conn, err := e.dial(n.GRPCAddr)
	if err != nil {
		return nil, nil, err
	}
	return idemv1.NewAdminClient(conn), func() { conn.Close() }, nil
}

type transferView struct {
	Shard          string `json:"shard"`
	PreviousLeader string `json:"previous_leader"`
	Leader         string `json:"leader"`
	Term           uint64 `json:"term"`
}

func runTransferLeader(ctx context.Context, e *env, args []string) error {
	topo, err := e.needTopology("transfer-leader")
	if err != nil {
		return err
	}
	shard, err := shardArg(topo, args[0])
	if err != nil {
		return err
	}
	target := ""
	if len(args) == 2 {
		target = args[1]
		if !shard.HasVoter(target) {
			return fmt.Errorf("%q is not a voter of shard %s (voters: %s)", target, shard.ID, strings.Join(shard.Voters, ", "))
		}
	}
	// The leader seen may lose its lead before the request reaches it (an
	// election after a membership change): ask again whoever leads then,
	// within the timeout.
	deadline := time.Now().Add(e.g.timeout)
	var before shardView
	for {
		before = findLeader(ctx, e, shard)
		if before.Leader == "" {
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("shard %s has no leader to hand over from (see idemctl status)", shard.ID)
			}
			time.Sleep(100 * time.Millisecond) // between status polls
			continue
		}
		if target == before.Leader {
			break
		}
		client, closeConn, err := adminClient(e, topo, before.Leader)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, e.g.timeout)
		_, err = client.TransferLeader(cctx, &idemv1.TransferLeaderRequest{Shard: shard.ID, TargetNodeId: target})
		cancel()
		closeConn()
		if err == nil {
			break
		}
		if c := status.Code(err); (c == codes.FailedPrecondition || c == codes.Unavailable) && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond) // the lead is moving: look again
			continue
		}
		return fmt.Errorf("transfer of shard %s on %s: %s", shard.ID, before.Leader, reason(err))
	}
	v := transferView{Shard: shard.ID, PreviousLeader: before.Leader}
	if target == before.Leader {
		v.Leader, v.Term = before.Leader, before.Term
	} else {
		// Wait until the voters agree on a new leader.
		deadline := time.Now().Add(e.g.timeout)
		for {
			after := findLeader(ctx, e, shard)
			if after.Leader != "" && after.Leader != before.Leader && (target == "" || after.Leader == target) {
				v.Leader, v.Term = after.Leader, after.Term
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("shard %s: %s stepped down but no new leader was seen within %s (now: %q); see idemctl status",
					shard.ID, before.Leader, e.g.timeout, after.Leader)
			}
			time.Sleep(50 * time.Millisecond) // between status polls
		}
	}
	if e.g.json {
		return writeJSON(e.stdout, v)
	}
	if v.Leader == v.PreviousLeader {
		fmt.Fprintf(e.stdout, "shard %s: %s already leads (term %d)\n", v.Shard, v.Leader, v.Term)
		return nil
	}
	fmt.Fprintf(e.stdout, "shard %s: leadership moved from %s to %s (term %d)\n", v.Shard, v.PreviousLeader, v.Leader, v.Term)
	return nil
}

type snapshotView struct {
	Shard string `json:"shard"`
	Node  string `json:"node"`
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
}

func runSnapshot(ctx context.Context, e *env, args []string) error {
	topo, err := e.needTopology("snapshot")
	if err != nil {
		return err
	}
	shard, err := shardArg(topo, args[0])
	if err != nil {
		return err
	}
	node := e.o.node
	if node != "" && !slices.Contains(shard.Voters, node) {
		return fmt.Errorf("--node %q is not a voter of shard %s (voters: %s)", node, shard.ID, strings.Join(shard.Voters, ", "))
	}
	if node == "" {
		if node = findLeader(ctx, e, shard).Leader; node == "" {
			return fmt.Errorf("shard %s has no leader; name a voter with --node", shard.ID)
		}
	}
	client, closeConn, err := adminClient(e, topo, node)
	if err != nil {
		return err
	}
	defer closeConn()
	cctx, cancel := context.WithTimeout(ctx, e.g.timeout)
	defer cancel()
	resp, err := client.Snapshot(cctx, &idemv1.SnapshotRequest{Shard: shard.ID})
	if err != nil {
		return fmt.Errorf("snapshot of shard %s on %s: %s", shard.ID, node, reason(err))
	}
	v := snapshotView{Shard: shard.ID, Node: node, Index: resp.GetIndex(), Term: resp.GetTerm()}
	if e.g.json {
		return writeJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "shard %s: snapshot on %s covers the log up to index %d (term %d)\n", v.Shard, v.Node, v.Index, v.Term)
	return nil
}
