package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/client"
	"github.com/idem-dev/idem/internal/cluster"
	"github.com/idem-dev/idem/internal/launch"
	"github.com/idem-dev/idem/internal/testutil"
	"github.com/idem-dev/idem/topology"
)

// chaosEnv turns on the dense topology chaos run (chaosDense); without it
// the test runs its bounded version (chaosBounded).
const chaosEnv = "IDEM_CHAOS"

// chaosShape is how much one topology chaos run does.
type chaosShape struct {
	records   int   // completed records loaded before the first change
	held      int   // keys held IN_PROGRESS across every change
	shards    []int // shards per region after each change (the run starts at 2)
	faults    int   // meta leader faults injected per change, at most
	changeFor time.Duration
}

var (
	// chaosDense is the run: 200k records on a 4,099-partition
	// ring (about 50 per partition, so the records a batch holds, and the
	// sizes different drivers pick, differ), 2 -> 5 -> 3 -> 6 -> 2.
	chaosDense = chaosShape{records: 200_000, held: 64, shards: []int{5, 3, 6, 2}, faults: 4, changeFor: 12 * time.Minute}
	// chaosBounded is what go test ./... runs on two cores.
	chaosBounded = chaosShape{records: 10_000, held: 24, shards: []int{5, 2}, faults: 3, changeFor: 5 * time.Minute}
)

// A three-node region holding many completed records is resharded again
// and again while its meta leader, which drives each change, is SIGKILLed
// and restarted on the same data dir at random moments and, at others, has
// its Raft traffic cut on loopback (iptables; see portCutter). Each apply is run again until
// its version is active. After every change each completed record replays
// identically (response and fencing token), each held key is still its
// owner's (another owner's reserve is IN_PROGRESS, the owner's repeat is
// the same reservation) and, at the end, its owner's complete succeeds.
// IDEM_CHAOS=1 runs the dense version; IDEM_SEED replays a seed.
func TestTopologyChangesUnderMetaLeaderChaos(t *testing.T) {
	shape := chaosBounded
	if os.Getenv(chaosEnv) == "1" {
		shape = chaosDense
	}
	bin := binaries.Path(t, "idemnode")
	seed := testutil.Seed(t)
	t.Logf("%s (%s=1 for the dense run)", testutil.ReplayLine(t.Name(), seed), chaosEnv)
	rng := testutil.Rand(seed, 0)
	cutter := newPortCutter(t)

	topo, err := launch.Topology(launch.Spec{Cluster: "chaos", NodesPerRegion: 3, ShardsPerRegion: 2, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	topo.Ring.PartitionCount = 4099
	dir := t.TempDir()
	c, err := cluster.NewNodes(topo, dir, bin, "--log-level", "info")
	if err != nil {
		t.Fatal(err)
	}
	c.StopOnCleanup(t)
	cutter.isolateGroups(c)
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = c.WaitReady(readyCtx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	var grpcAddrs []string
	for _, n := range topo.Nodes() {
		grpcAddrs = append(grpcAddrs, n.GRPCAddr)
	}
	cl, err := client.New(client.Config{Endpoints: grpcAddrs})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	begin := time.Now()
	d := newDenseData(shape.records, shape.held)
	if err := d.load(ctx, cl); err != nil {
		t.Fatal(err)
	}
	loaded := time.Since(begin)
	t.Logf("loaded %d completed records and %d held keys in %v (%.0f records/s)", shape.records, shape.held,
		loaded.Round(time.Millisecond), float64(shape.records)/loaded.Seconds())
	d.verify(t, ctx, cl, "before the changes")

	var kills, cuts, deposed int
	prev, from := c.TopologyPath, topo.ShardsPerRegion
	var changes []string
	for i, to := range shape.shards {
		next := topo.Clone()
		next.ShardsPerRegion = to
		v := i + 2
		path := nextVersion(t, next, v, dir)
		start := time.Now()
		f := &metaFaults{t: t, c: c, topo: topo, rng: rand.New(rand.NewPCG(rng.Uint64(), uint64(v))), cutter: cutter, max: shape.faults}
		runs := applyUntilActive(t, ctx, prev, path, v, shape.changeFor, f)
		took := time.Since(start)
		kills, cuts, deposed = kills+f.kills, cuts+f.cuts, deposed+f.deposed
		line := fmt.Sprintf("%d -> %d shards per region (version %d) active after %v and %d applies; %s", from, to, v, took.Round(time.Millisecond), runs, f)
		t.Log(line)
		changes = append(changes, line)
		readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := c.WaitReady(readyCtx)
		cancel()
		if err != nil {
			t.Fatalf("after %s: %v", line, err)
		}
		d.verify(t, ctx, cl, fmt.Sprintf("after %d -> %d shards", from, to))
		prev, from = path, to
	}
	d.completeHeld(t, ctx, cl)
	t.Logf("topology chaos, seed %d: %d records loaded in %v; %d changes (%s); %d meta leader SIGKILLs, %d Raft cuts (%d of which moved meta leadership away from it)%s; every record replayed after each change (%d replays checked); %v in all",
		seed, shape.records, loaded.Round(time.Millisecond), len(shape.shards), strings.Join(changes, "; "), kills, cuts, deposed, cutter.note(), d.checks.Load(), time.Since(begin).Round(time.Millisecond))
}

// applyUntilActive runs idemctl topology apply of path (version v) until
// it returns with v active, while f injects its faults into the meta
// leader. A run that fails (its node killed under it) or prints nothing
// for a minute is run again; the test fails once within passed. It
// returns how many applies it ran.
func applyUntilActive(t *testing.T, ctx context.Context, prev, path string, v int, within time.Duration, f *metaFaults) int {
	t.Helper()
	deadline := time.Now().Add(within)
	fctx, stopFaults := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { f.run(fctx) })
	defer func() { stopFaults(); wg.Wait() }()
	runs := 0
	var last string
	for time.Now().Before(deadline) {
		runs++
		out, err := ctlUntilStalled(ctx, time.Minute, "--config", prev, "--timeout", "10s", "topology", "apply", path)
		if err == nil {
			stopFaults()
			wg.Wait()
			// The apply saw the version active; status agrees.
			st, serr := ctl(t, "--config", path, "--timeout", "10s", "topology", "status")
			if serr == nil && strings.Contains(st, "active version: "+strconv.Itoa(v)) {
				return runs
			}
			last = fmt.Sprintf("apply returned, status: %v\n%s", serr, st)
			continue
		}
		last = fmt.Sprintf("%v\n%s", err, out)
		t.Logf("apply of version %d (run %d) did not finish, running it again: %v", v, runs, err)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Second):
		}
	}
	t.Fatalf("version %d not active after %v and %d applies; last: %s", v, within, runs, last)
	return runs
}

// ctlUntilStalled runs idemctl with args, and cancels it once it printed
// nothing new for stall.
func ctlUntilStalled(ctx context.Context, stall time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stdout, stderr testutil.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, &stdout, &stderr) }()
	printed, since := 0, time.Now()
	for {
		select {
		case err := <-done:
			if err != nil {
				err = fmt.Errorf("idemctl %s: %w (%s)", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
			}
			return stdout.String(), err
		case <-time.After(500 * time.Millisecond):
		}
		if n := stdout.Len(); n != printed {
			printed, since = n, time.Now()
		} else if time.Since(since) > stall {
			cancel()
			err := <-done
			return stdout.String(), fmt.Errorf("idemctl %s: nothing new printed for %v: %v", strings.Join(args, " "), stall, err)
		}
	}
}

// metaFaults injects, while one change runs, up to max faults into the
// node that leads the meta group at that moment: a SIGKILL and a restart
// on the same data dir, or (when cutter can) its Raft port cut for a few
// seconds while its gRPC port stays reachable. The first waits until a
// batch of partitions moved (so it lands mid-move) or a few seconds
// passed; the others come at random moments after it.
type metaFaults struct {
	t      *testing.T
	c      *cluster.Cluster
	topo   *topology.Topology
	rng    *rand.Rand
	cutter *portCutter
	max    int

	kills, cuts, deposed int
	events               []string
}

func (f *metaFaults) String() string {
	if len(f.events) == 0 {
		return "no fault injected (the change was done first)"
	}
	return strings.Join(f.events, ", ")
}

func (f *metaFaults) run(ctx context.Context) {
	start := time.Now()
	offsets := map[string]int64{}
	for id, p := range f.c.Nodes {
		if fi, err := os.Stat(p.Log); err == nil {
			offsets[id] = fi.Size()
		}
	}
	for i := 0; i < f.max; i++ {
		wait := time.Duration(300+f.rng.IntN(2500)) * time.Millisecond
		if i == 0 {
			// mid-move: wait for the first batch moved, up to 20 s
			for time.Since(start) < 20*time.Second && !f.movedSince(offsets) {
				if !sleepCtx(ctx, 100*time.Millisecond) {
					return
				}
			}
			wait = time.Duration(f.rng.IntN(800)) * time.Millisecond
		}
		if !sleepCtx(ctx, wait) {
			return
		}
		leader := f.metaLeader(ctx, 20*time.Second, "")
		if leader == "" {
			continue
		}
		at := time.Since(start).Round(100 * time.Millisecond)
		if f.cutter.ok && f.rng.IntN(2) == 0 {
			hold := time.Duration(5000+f.rng.IntN(5000)) * time.Millisecond
			if err := f.cutter.cut(f.c, leader); err != nil {
				f.t.Errorf("cutting %s's Raft traffic: %v", leader, err)
				return
			}
			f.cuts++
			moved := ""
			deadline := time.Now().Add(hold)
			for time.Now().Before(deadline) && moved == "" {
				if !sleepCtx(context.Background(), 300*time.Millisecond) {
					break
				}
				if l := f.metaLeader(ctx, time.Second, leader); l != "" {
					moved = l
				}
			}
			if !sleepCtx(context.Background(), time.Until(deadline)) {
				return
			}
			if err := f.cutter.heal(leader); err != nil {
				f.t.Errorf("healing %s's Raft traffic: %v", leader, err)
				return
			}
			what := "kept meta leadership"
			if moved != "" {
				f.deposed++
				what = "meta leadership moved to " + moved
			}
			f.events = append(f.events, fmt.Sprintf("%s's Raft traffic cut at +%v for %v (%s)", leader, at, hold, what))
			continue
		}
		down := time.Duration(f.rng.IntN(2000)) * time.Millisecond
		p := f.c.Nodes[leader]
		if err := p.Kill(); err != nil {
			f.t.Errorf("killing %s: %v", leader, err)
			return
		}
		f.kills++
		sleepCtx(context.Background(), down)
		if err := p.Start(); err != nil {
			f.t.Errorf("restarting %s: %v", leader, err)
			return
		}
		f.events = append(f.events, fmt.Sprintf("%s SIGKILLed at +%v, restarted %v later", leader, at, down))
	}
}

// movedSince reports whether a node logged a batch of partitions moved
// past offsets (node id -> log size when the change started).
func (f *metaFaults) movedSince(offsets map[string]int64) bool {
	for id, p := range f.c.Nodes {
		data, err := os.ReadFile(p.Log)
		if err != nil || int64(len(data)) < offsets[id] {
			continue
		}
		if strings.Contains(string(data[offsets[id]:]), "partitions moved") {
			return true
		}
	}
	return false
}

// metaLeader is the node (not except) that says it leads the meta group,
// "" if none did within d.
func (f *metaFaults) metaLeader(ctx context.Context, d time.Duration, except string) string {
	deadline := time.Now().Add(d)
	for {
		for _, n := range f.topo.Nodes() {
			if p := f.c.Nodes[n.ID]; p == nil || !p.Running() || n.ID == except {
				continue
			}
			conn, err := (&env{}).dial(n.GRPCAddr)
			if err != nil {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := idemv1.NewTopologyClient(conn).ShardState(sctx, &idemv1.ShardStateRequest{Shard: "meta"})
			cancel()
			conn.Close()
			if err == nil && st.GetLeader() {
				return n.ID
			}
		}
		if time.Now().After(deadline) || !sleepCtx(ctx, 200*time.Millisecond) {
			return ""
		}
	}
}

// sleepCtx waits d, false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// portCutter cuts one node's Raft traffic on loopback with iptables
// (127.0.0.1 only): TCP to its Raft port is dropped (INPUT and OUTPUT), and
// so is TCP the node itself sends to the other nodes' Raft ports, matched
// by the group id each node runs with (-m owner --gid-owner; see
// isolateGroups). Its gRPC and HTTP ports stay reachable, and it reaches
// the others' gRPC ports. ok is false where it cannot (no iptables, not
// root, no permission): the chaos test then only kills, and says so.
// Every rule it adds is removed in a cleanup.
type portCutter struct {
	ok     bool
	why    string
	mu     sync.Mutex
	active map[string][][]string // node id -> the rules that cut it
}

func newPortCutter(t *testing.T) *portCutter {
	pc := &portCutter{active: map[string][][]string{}}
	switch _, err := exec.LookPath("iptables"); {
	case err != nil:
		pc.why = "iptables is not installed"
	case os.Geteuid() != 0:
		pc.why = "not root"
	default:
		// A rule of the cut's shape that matches nothing of anyone's (this
		// test's group, to port 9 of loopback), added and removed: where it
		// cannot be (no NET_ADMIN, no owner match), nothing is cut.
		probe := [][]string{{"OUTPUT", "-p", "tcp", "-s", "127.0.0.1", "-d", "127.0.0.1", "-m", "owner", "--gid-owner", strconv.Itoa(chaosGroupBase()),
			"-m", "multiport", "--dports", "9", "-j", "DROP"}}
		if err := iptables("-A", probe); err != nil {
			pc.why = err.Error()
		} else if err := iptables("-D", probe); err != nil {
			t.Fatalf("removing the probe rule: %v", err)
		} else {
			pc.ok = true
		}
	}
	if !pc.ok {
		t.Logf("Raft port cuts off (%s): the meta leader is only SIGKILLed", pc.why)
	}
	t.Cleanup(func() {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		for id, rules := range pc.active {
			if err := iptables("-D", rules); err != nil {
				t.Errorf("removing the iptables rules that cut %s: %v", id, err)
			}
		}
	})
	return pc
}

// isolateGroups gives each node of c a group id of its own (by the test
// process's pid, so that two runs at once do not share one), for cut's
// owner match. Nothing when pc cannot cut.
func (pc *portCutter) isolateGroups(c *cluster.Cluster) {
	if !pc.ok {
		return
	}
	for i, n := range c.Topology.Nodes() {
		c.Nodes[n.ID].SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(os.Geteuid()), Gid: uint32(chaosGroupBase() + 1 + i), NoSetGroups: true}}
	}
}

// chaosGroupBase is the first of the group ids this test process uses.
func chaosGroupBase() int { return 200_000 + os.Getpid()%100_000*16 }

func (pc *portCutter) note() string {
	if pc.ok {
		return ""
	}
	return " (no Raft port cut: " + pc.why + ")"
}

// cut cuts node id's Raft traffic both ways (see portCutter).
func (pc *portCutter) cut(c *cluster.Cluster, id string) error {
	n, ok := c.Topology.NodeByID(id)
	if !ok || c.Nodes[id].SysProcAttr == nil {
		return fmt.Errorf("%s: not a node this test gave a group id", id)
	}
	port := n.RaftAddr[strings.LastIndex(n.RaftAddr, ":")+1:]
	var others []string
	for _, o := range c.Topology.Nodes() {
		if o.ID != id {
			others = append(others, o.RaftAddr[strings.LastIndex(o.RaftAddr, ":")+1:])
		}
	}
	lo := []string{"-p", "tcp", "-s", "127.0.0.1", "-d", "127.0.0.1"}
	rules := [][]string{
		append(append([]string{"INPUT"}, lo...), "--dport", port, "-j", "DROP"),
		append(append([]string{"OUTPUT"}, lo...), "--dport", port, "-j", "DROP"),
		append(append([]string{"OUTPUT"}, lo...), "-m", "owner", "--gid-owner", strconv.FormatUint(uint64(c.Nodes[id].SysProcAttr.Credential.Gid), 10),
			"-m", "multiport", "--dports", strings.Join(others, ","), "-j", "DROP"),
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.active[id] = rules
	return iptables("-A", rules)
}

// heal removes the rules cut added for id.
func (pc *portCutter) heal(id string) error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	rules := pc.active[id]
	delete(pc.active, id)
	return iptables("-D", rules)
}

// iptables adds (-A) or deletes (-D) each of rules (chain first).
func iptables(op string, rules [][]string) error {
	var errs []error
	for _, r := range rules {
		args := append([]string{"-w", op}, r...)
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// denseData is the records the chaos test loads and checks: completed
// keys with their fencing tokens, and keys held IN_PROGRESS.
type denseData struct {
	n      int
	tokens []uint64 // tokens[i] is c-<i>'s fencing token
	held   []heldKey
	holdN  int
	checks atomic.Int64
}

const chaosNS = "payments"

func newDenseData(records, held int) *denseData {
	return &denseData{n: records, tokens: make([]uint64, records), holdN: held}
}

func chaosKey(i int) string   { return "c-" + strconv.Itoa(i) }
func chaosOwner(i int) string { return fmt.Sprintf("chaos-owner-%08d", i) }
func chaosBody(i int) []byte  { return []byte("response of c-" + strconv.Itoa(i)) }

// chaosBatch is the items per batch call (a quarter of the API's limit,
// so that one call fits its deadline on a loaded box), chaosWorkers how
// many batch calls load and verify send at once, chaosBatchWithin how long
// one batch's items may go unanswered (leaders moving) before the test
// fails.
const (
	chaosBatch   = 250
	chaosWorkers = 4

	chaosBatchWithin = 5 * time.Minute
)

// load reserves and completes every record with batch calls (workers at
// once), retrying an item that failed with the same owner token (the
// same reservation), and reserves the held keys with a 10-minute lease.
func (d *denseData) load(ctx context.Context, cl *client.Client) error {
	if err := d.eachBatch(ctx, d.loadBatch, cl); err != nil {
		return err
	}
	for i := range d.holdN {
		k := heldKey{key: "held-" + strconv.Itoa(i), owner: fmt.Sprintf("holder-token-%06d", i)}
		r, err := cl.Reserve(ctx, client.ReserveRequest{Namespace: chaosNS, Key: k.key, OwnerToken: k.owner, Lease: 10 * time.Minute})
		if err != nil || r.Outcome != client.OutcomeAcquired {
			return fmt.Errorf("reserving %s: %+v %v", k.key, r, err)
		}
		k.token = strconv.FormatUint(r.FencingToken, 10)
		d.held = append(d.held, k)
	}
	return nil
}

func (d *denseData) loadBatch(ctx context.Context, cl *client.Client, from, to int) error {
	return rounds(ctx, from, to, "completed", func(pending []int) (retry []int, last error, err error) {
		reqs := make([]client.ReserveRequest, len(pending))
		for j, i := range pending {
			reqs[j] = client.ReserveRequest{Key: chaosKey(i), OwnerToken: chaosOwner(i)}
		}
		var acquired []int
		for j, r := range cl.ReserveMany(ctx, chaosNS, reqs) {
			i := pending[j]
			switch {
			case r.Err != nil:
				last = r.Err
			case r.Outcome == client.OutcomeAcquired:
				d.tokens[i] = r.FencingToken
				acquired = append(acquired, i)
			case r.Outcome == client.OutcomeCompleted && d.tokens[i] != 0 && r.FencingToken == d.tokens[i]:
				// completed on an earlier round whose answer was lost
			default:
				return nil, nil, fmt.Errorf("reserve of fresh key %s: %+v", chaosKey(i), r.Reservation)
			}
		}
		creqs := make([]client.CompleteRequest, len(acquired))
		for j, i := range acquired {
			creqs[j] = client.CompleteRequest{Key: chaosKey(i), OwnerToken: chaosOwner(i), Response: client.Response{Status: 201, Body: chaosBody(i)}}
		}
		for j, r := range cl.CompleteMany(ctx, chaosNS, creqs) {
			if r.Err != nil {
				last = r.Err
				retry = append(retry, acquired[j])
			}
		}
		for _, i := range pending {
			if d.tokens[i] == 0 {
				retry = append(retry, i)
			}
		}
		return retry, last, nil
	})
}

// eachBatch runs batch on every chaosBatch records, chaosWorkers at once,
// and returns the first error (which stops the others).
func (d *denseData) eachBatch(ctx context.Context, batch func(context.Context, *client.Client, int, int) error, cl *client.Client) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan int)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		failure error
	)
	for range chaosWorkers {
		wg.Go(func() {
			for from := range batches {
				if err := batch(ctx, cl, from, min(from+chaosBatch, d.n)); err != nil {
					mu.Lock()
					if failure == nil {
						failure = err
					}
					mu.Unlock()
					cancel()
				}
			}
		})
	}
	for from := 0; from < d.n && ctx.Err() == nil; from += chaosBatch {
		batches <- from
	}
	close(batches)
	wg.Wait()
	return failure
}

// rounds runs round on the records from..to that are still pending until
// none is, pausing between rounds, for up to chaosBatchWithin (what says
// what a record must become, for the error). round returns the records to
// try again, the last error an item got, and an error that ends it all.
func rounds(ctx context.Context, from, to int, what string, round func(pending []int) (retry []int, last error, err error)) error {
	pending := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		pending = append(pending, i)
	}
	deadline := time.Now().Add(chaosBatchWithin)
	var last error
	for len(pending) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("records %d..%d: %d not %s after %v, last: %w", from, to, len(pending), what, chaosBatchWithin, last)
		}
		retry, l, err := round(pending)
		if err != nil {
			return err
		}
		if l != nil {
			last = l
		}
		if pending = retry; len(pending) > 0 && !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// verify checks every record and held key (see the test's comment).
func (d *denseData) verify(t *testing.T, ctx context.Context, cl *client.Client, when string) {
	t.Helper()
	start := time.Now()
	if err := d.eachBatch(ctx, d.verifyBatch, cl); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	for _, k := range d.held {
		r, err := retryCall(ctx, func() (client.Reservation, error) {
			return cl.Reserve(ctx, client.ReserveRequest{Namespace: chaosNS, Key: k.key, OwnerToken: "intruder-token-0001"})
		})
		if err != nil || r.Outcome != client.OutcomeInProgress {
			t.Fatalf("%s: %s held by its owner, another owner's reserve answered %+v %v", when, k.key, r, err)
		}
		r, err = retryCall(ctx, func() (client.Reservation, error) {
			return cl.Reserve(ctx, client.ReserveRequest{Namespace: chaosNS, Key: k.key, OwnerToken: k.owner, Lease: 10 * time.Minute})
		})
		if err != nil || r.Outcome != client.OutcomeAcquired || strconv.FormatUint(r.FencingToken, 10) != k.token {
			t.Fatalf("%s: %s's owner repeating its reserve (token %s) got %+v %v", when, k.key, k.token, r, err)
		}
		if _, err := cl.Heartbeat(ctx, client.HeartbeatRequest{Namespace: chaosNS, Key: k.key, OwnerToken: k.owner, Lease: 10 * time.Minute}); err != nil {
			t.Fatalf("%s: %s's owner heartbeat: %v", when, k.key, err)
		}
	}
	t.Logf("%s: %d records replayed with their responses and tokens, %d held keys kept by their owners, in %v",
		when, d.n, len(d.held), time.Since(start).Round(time.Millisecond))
}

// verifyBatch asks another owner to reserve records from..to: each must
// answer COMPLETED with the record's response and fencing token. An item
// that failed (a leader moving) is asked again for up to chaosBatchWithin.
func (d *denseData) verifyBatch(ctx context.Context, cl *client.Client, from, to int) error {
	return rounds(ctx, from, to, "answered", func(pending []int) (retry []int, last error, err error) {
		reqs := make([]client.ReserveRequest, len(pending))
		for j, i := range pending {
			reqs[j] = client.ReserveRequest{Key: chaosKey(i), OwnerToken: "another-owner-token-0001"}
		}
		for j, r := range cl.ReserveMany(ctx, chaosNS, reqs) {
			i := pending[j]
			if r.Err != nil {
				if ctx.Err() != nil {
					return nil, nil, ctx.Err()
				}
				last = r.Err
				retry = append(retry, i)
				continue
			}
			if r.Outcome != client.OutcomeCompleted || r.Response == nil || string(r.Response.Body) != string(chaosBody(i)) ||
				r.Response.Status != 201 || r.FencingToken != d.tokens[i] {
				return nil, nil, fmt.Errorf("completed record %s (token %d) answered %+v (response %+v)", chaosKey(i), d.tokens[i], r.Reservation, r.Response)
			}
			d.checks.Add(1)
		}
		return retry, last, nil
	})
}

// completeHeld completes every held key by its owner: it must succeed,
// and the key then replays with the token its owner was given.
func (d *denseData) completeHeld(t *testing.T, ctx context.Context, cl *client.Client) {
	t.Helper()
	for _, k := range d.held {
		if _, err := cl.Complete(ctx, client.CompleteRequest{Namespace: chaosNS, Key: k.key, OwnerToken: k.owner, Response: client.Response{Status: 200, Body: []byte(k.key)}}); err != nil {
			t.Fatalf("%s completed by its owner after the changes: %v", k.key, err)
		}
		r, err := retryCall(ctx, func() (client.Reservation, error) {
			return cl.Reserve(ctx, client.ReserveRequest{Namespace: chaosNS, Key: k.key, OwnerToken: "intruder-token-0001"})
		})
		if err != nil || r.Outcome != client.OutcomeCompleted || strconv.FormatUint(r.FencingToken, 10) != k.token {
			t.Fatalf("%s after its owner completed it: %+v %v (token %s)", k.key, r, err, k.token)
		}
	}
}

// retryCall runs call until it returns no error, for up to a minute.
func retryCall(ctx context.Context, call func() (client.Reservation, error)) (client.Reservation, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := call()
		if err == nil || time.Now().After(deadline) || !sleepCtx(ctx, 200*time.Millisecond) {
			return r, err
		}
	}
}
