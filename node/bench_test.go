package node

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/topology"
)

// BenchmarkCycle measures reserve+complete cycles on fresh keys, in process,
// the way cmd/idembench does from outside: on a dev node (one node, four
// shards, one replica) and on a three-node region (four shards, three
// replicas, leaders spread), each at 16 and 64 concurrent clients, through
// the Backend (node.Apply: Raft, fsm, forwarding; no API encoding), the gRPC
// API (package client over loopback) and the JSON API (HTTP/1.1 keep-alive).
// Reported per run: cycles/s, cycle latency p50/p99, the leaders' log
// entries per log write (StoreLogs call), fsync'd log commits per cycle on
// all nodes together (with the pebble log: its WAL fdatasyncs), group log
// writes per commit (above 1 with the pebble log, whose WAL syncs cover
// every batch committed meanwhile), time per commit (pebble: time of its
// batches, which overlap, per WAL sync), and the process's CPU time per
// cycle (which, unlike cycles/s, hardly depends on what else the box runs).
//
// fsync stays on, as in production; IDEM_BENCH_NOFSYNC=1 turns it off to see
// the CPU cost alone. Profile with, e.g.:
//
//	go test -run XXX -bench 'Cycle/dev/grpc/c64' -benchtime 20000x -cpuprofile cpu.out ./node
//	go tool pprof -top node.test cpu.out
func BenchmarkCycle(b *testing.B) {
	for _, layout := range []string{"dev", "three"} {
		for _, api := range []string{"leader", "backend", "grpc", "json"} {
			for _, conc := range []int{16, 64} {
				for _, log := range raftstore.LogStores {
					b.Run(fmt.Sprintf("%s/%s/c%d/log=%s", layout, api, conc, log), func(b *testing.B) {
						c := benchClusterFor(b, layout, log)
						var cycle func(ctx context.Context, worker int, key string) error
						switch api {
						case "leader":
							cycle = c.leaderCycle
						case "backend":
							cycle = c.backendCycle
						case "grpc":
							cycle = c.grpcCycle
						case "json":
							cycle = c.jsonCycle
						}
						runCycles(b, c, conc, cycle)
					})
				}
			}
		}
	}
}

// benchBody is the stored response body, as idembench's default (512 bytes).
var benchBody = bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz"), 20)[:512]

// runCycles runs b.N cycles over conc workers and reports the figures.
func runCycles(b *testing.B, c *benchCluster, conc int, cycle func(ctx context.Context, worker int, key string) error) {
	ctx := b.Context()
	before := c.logStats()
	cpuBefore := processCPU()
	lat := make([][]time.Duration, conc)
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := cycle(ctx, w, client.NewKey()); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU() - cpuBefore
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d cycles failed; first: %v", n, b.N, firstErr.Load())
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(q float64) float64 {
		return float64(all[min(len(all)-1, int(q*float64(len(all))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cycles/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	// CPU time of the whole process (nodes and clients) per cycle: unlike
	// cycles/s, it hardly depends on what else the box is running.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/cycle")
	after := c.logStats()
	if commits := after.commits - before.commits; commits > 0 {
		b.ReportMetric(float64(after.entries-before.entries)/float64(commits), "entries/write")
	}
	if fsyncs := after.fsyncs - before.fsyncs; fsyncs > 0 {
		b.ReportMetric(float64(fsyncs)/float64(b.N), "commits/cycle")
		b.ReportMetric(float64(after.writes-before.writes)/float64(fsyncs), "writes/commit")
		b.ReportMetric(float64((after.commitTime-before.commitTime).Microseconds())/float64(fsyncs), "µs/commit")
	}
	b.ReportMetric(0, "ns/op") // meaningless for concurrent cycles
}

// benchCluster is a running cluster with a client per API.
type benchCluster struct {
	nodes []*Node
	grpc  *client.Client
	http  *http.Client
	tr    *http.Transport
	next  atomic.Uint64
	dir   string // removed by close
}

var (
	benchClustersMu sync.Mutex
	benchClusters   = map[string]*benchCluster{}
)

// TestMain closes the clusters the benchmarks shared.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, c := range benchClusters {
		c.close()
	}
	os.Exit(code)
}

// benchClusterFor starts a cluster for layout on first use and shares it
// between the sub-benchmarks (each of which runs several times).
func benchClusterFor(b *testing.B, layout string, logStore string) *benchCluster {
	benchClustersMu.Lock()
	defer benchClustersMu.Unlock()
	name := fmt.Sprintf("%s/log=%s", layout, logStore)
	if c := benchClusters[name]; c != nil {
		return c
	}
	nodes := 1
	if layout == "three" {
		nodes = 3
	}
	c, err := startBenchCluster(nodes, logStore, os.Getenv("IDEM_BENCH_NOFSYNC") == "1")
	if err != nil {
		b.Fatal(err)
	}
	benchClusters[name] = c
	return c
}

// freeAddrs returns n distinct loopback addresses that were free a moment
// ago (the topology needs fixed ports before the listeners exist).
func freeAddrs(n int) ([]string, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

func startBenchCluster(n int, logStore string, noFsync bool) (_ *benchCluster, err error) {
	addrs, err := freeAddrs(3 * n)
	if err != nil {
		return nil, err
	}
	topo := &topology.Topology{Cluster: "bench", ShardsPerRegion: 4, Replicas: n, Survival: topology.SurvivalZone}
	region := topology.Region{Name: "local"}
	for i := range n {
		region.Nodes = append(region.Nodes, topology.Node{
			ID: "n" + strconv.Itoa(i+1), Region: "local",
			RaftAddr: addrs[3*i], GRPCAddr: addrs[3*i+1], HTTPAddr: addrs[3*i+2],
		})
	}
	topo.Regions = []topology.Region{region}
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idem-bench-")
	if err != nil {
		return nil, err
	}
	// The dir lives until close: pebble creates files (WAL, sstables)
	// as it runs, so it cannot be unlinked early.
	c := &benchCluster{dir: dir}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	rc := raftstore.DefaultConfig()
	rc.NoFsync = noFsync
	rc.LogStore = logStore
	var grpcAddrs []string
	for _, nd := range region.Nodes {
		nn, err := New(Config{
			Topology: topo, NodeID: nd.ID, DataDir: dir + "/" + nd.ID, Raft: rc,
			ClockSkewMargin: time.Second, LeaderBalanceInterval: 100 * time.Millisecond,
		})
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, nn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := startTogether(ctx, c.nodes, func(i int) { go c.nodes[i].Serve(context.Background()) }); err != nil {
		return nil, err
	}
	for _, nn := range c.nodes {
		grpcAddrs = append(grpcAddrs, nn.GRPCAddr())
	}
	for _, nn := range c.nodes {
		if err := nn.WaitReady(ctx); err != nil {
			return nil, err
		}
	}
	// Wait until leadership is spread as the balancer wants it (each shard
	// led by its preferred voter), so runs do not depend on election luck.
	for {
		balanced := true
		for _, nn := range c.nodes {
			for _, s := range nn.shardMap() {
				if id, _ := s.group.Leader(); id != s.info.Voters[0] {
					balanced = false
				}
			}
		}
		if balanced {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("leaders not balanced: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	ccfg := client.DefaultConfig(grpcAddrs...)
	ccfg.MaxAttempts = 1
	if c.grpc, err = client.New(ccfg); err != nil {
		return nil, err
	}
	c.tr = &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256, DisableCompression: true}
	c.http = &http.Client{Transport: c.tr, Timeout: 10 * time.Second}
	return c, nil
}

func (c *benchCluster) close() {
	if c.grpc != nil {
		c.grpc.Close()
	}
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() { n.Close() })
	}
	wg.Wait()
	os.RemoveAll(c.dir)
}

// processCPU is the user and system CPU time this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type logStats struct {
	commits, entries uint64 // StoreLogs calls of the groups' leaders, entries they wrote
	// Fsync'd commits on all nodes: own bolt files' StoreLogs (which are
	// all the groups' writes there, apart from rare stable-store sets),
	// shared-log commits and the pebble logs' WAL syncs, and the group
	// writes those carried.
	fsyncs, writes uint64
	commitTime     time.Duration // spent in those commits
}

// logStats sums the log writes of every group on the node that leads it,
// and the fsync'd log commits of every node.
func (c *benchCluster) logStats() logStats {
	var s logStats
	for _, n := range c.nodes {
		for _, sh := range n.shardMap() {
			st := sh.group.Stats()
			if st.State == "Leader" {
				s.commits += st.LogCommits
				s.entries += st.LogEntries
			}
			if st.LogStore == raftstore.LogStoreBolt {
				s.fsyncs += st.LogCommits
				s.writes += st.LogCommits
				s.commitTime += st.LogCommitTime
			}
		}
		pl := n.host.PebbleLogStats()
		s.fsyncs += pl.WALSyncs
		s.writes += pl.Commits
		s.commitTime += pl.CommitTime
	}
	return s
}

const benchNamespace = "bench"

// backendCycle calls Node.Apply as the API server would, rotating over the
// nodes (so, on three nodes, two thirds of the commands are forwarded).
func (c *benchCluster) backendCycle(ctx context.Context, worker int, key string) error {
	return c.applyCycle(ctx, key, func() *Node { return c.nodes[int(c.next.Add(1)%uint64(len(c.nodes)))] })
}

// leaderCycle calls Node.Apply on the leader of the key's shard: Raft and
// the fsm without any forwarding.
func (c *benchCluster) leaderCycle(ctx context.Context, worker int, key string) error {
	return c.applyCycle(ctx, key, func() *Node {
		id := c.nodes[0].view().ring.Locate(benchNamespace, key).ID
		for _, n := range c.nodes {
			if n.shard(id).group.IsLeader() {
				return n
			}
		}
		return c.nodes[0]
	})
}

func (c *benchCluster) applyCycle(ctx context.Context, key string, pick func() *Node) error {
	n := pick()
	owner := client.NewOwnerToken()
	res, err := n.Apply(ctx, &fsm.Command{Op: fsm.OpReserve, Namespace: benchNamespace, Key: key,
		OwnerToken: owner, Lease: int64(30 * time.Second)})
	if err != nil {
		return err
	}
	if res.Outcome != fsm.OutcomeAcquired {
		return fmt.Errorf("reserve of a fresh key: %v", res.Outcome)
	}
	n = pick()
	res, err = n.Apply(ctx, &fsm.Command{Op: fsm.OpComplete, Namespace: benchNamespace, Key: key,
		OwnerToken: owner, Retention: int64(24 * time.Hour),
		Response: &fsm.Response{Status: 200, Headers: map[string]string{"Content-Type": "application/octet-stream"}, Body: benchBody}})
	if err != nil {
		return err
	}
	if res.Outcome != fsm.OutcomeOK {
		return fmt.Errorf("complete: %v", res.Outcome)
	}
	return nil
}

func (c *benchCluster) grpcCycle(ctx context.Context, worker int, key string) error {
	r, err := c.grpc.Reserve(ctx, client.ReserveRequest{Namespace: benchNamespace, Key: key})
	if err != nil {
		return err
	}
	if r.Outcome != client.OutcomeAcquired {
		return fmt.Errorf("reserve of a fresh key: %v", r.Outcome)
	}
	_, err = c.grpc.Complete(ctx, client.CompleteRequest{Namespace: benchNamespace, Key: key, OwnerToken: r.OwnerToken,
		Response: client.Response{Status: 200, Headers: map[string]string{"Content-Type": "application/octet-stream"}, Body: benchBody}})
	return err
}

var benchCompleteTail = func() []byte {
	resp, _ := json.Marshal(map[string]any{"status": 200, "headers": map[string]string{"Content-Type": "application/octet-stream"},
		"body": base64.StdEncoding.EncodeToString(benchBody)})
	return append(append([]byte(`,"response":`), resp...), '}')
}()

func (c *benchCluster) jsonCycle(ctx context.Context, worker int, key string) error {
	var out struct {
		Outcome    string `json:"outcome"`
		OwnerToken string `json:"owner_token"`
	}
	if err := c.post(ctx, key, "reserve", []byte(`{}`), &out); err != nil {
		return err
	}
	if out.Outcome != "ACQUIRED" {
		return fmt.Errorf("reserve of a fresh key: %s", out.Outcome)
	}
	tok, _ := json.Marshal(out.OwnerToken)
	body := append(append([]byte(`{"owner_token":`), tok...), benchCompleteTail...)
	return c.post(ctx, key, "complete", body, nil)
}

func (c *benchCluster) post(ctx context.Context, key, verb string, body []byte, out any) error {
	n := c.nodes[int(c.next.Add(1)%uint64(len(c.nodes)))]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://"+n.HTTPAddr()+"/v1/namespaces/"+benchNamespace+"/keys/"+key+":"+verb, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %.200s", verb, resp.StatusCode, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
