package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/internal/serving"
	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/security/auth"
	"github.com/idem-dev/idem/security/pki"
)

// A node bootstraps its groups only on the first start of a new cluster
// (an empty data dir and a file at version 1). An empty data dir alone does
// not tell a new cluster from a node whose dir was emptied or lost while its
// peers kept running: bootstrapping then would put a replica with no log and
// no vote among voters that hold state. So before it bootstraps, a node asks
// every other node of the file, over the nodes' gRPC port, whether it holds
// Raft state of a group they share (ShardState), and bootstraps only once
// every one of them answered:
//
//   - empty: the peer is itself waiting to bootstrap (it answers from a
//     small server that serves ShardState alone, with nothing hosted);
//   - or holding state that it bootstrapped after asking this node (a peer
//     that saw every node empty, this one included, and went first).
//
// A peer that holds state and never asked this node belongs to a running
// cluster: the node refuses to start with one line. A peer that does not
// answer (down, or never started) is waited for, with a line every
// firstStartLogEvery naming who has not answered: it may hold state.

// errStoppedBeforeFirstStart: the node was stopped while it waited for
// its peers; nothing was written, so Run ends cleanly.
var errStoppedBeforeFirstStart = errors.New("node: stopped before the first start")

// firstStartMetadata is the gRPC metadata key a node waiting to bootstrap
// sends with its ShardState calls, with its node id: the peers it asks
// record it (an ordinary ShardState of a running node carries none).
const firstStartMetadata = "idem-first-start"

// firstStartPoll is how often a waiting node asks the peers that have not
// answered yet; firstStartLogEvery how often it says whom it waits for.
const (
	firstStartPoll     = 200 * time.Millisecond
	firstStartLogEvery = 10 * time.Second
)

// dataDirEmpty reports whether dir is missing or empty: no identity file and
// nothing else (a dir with other files is refused by datadir.Check).
func dataDirEmpty(dir string) bool {
	entries, err := os.ReadDir(dir)
	return errors.Is(err, os.ErrNotExist) || err == nil && len(entries) == 0
}

// otherNodes lists the ids of the file's nodes but this one.
func (n *Node) otherNodes() []string {
	var ids []string
	for _, nd := range n.cfg.Topology.Nodes() {
		if nd.ID != n.cfg.NodeID {
			ids = append(ids, nd.ID)
		}
	}
	return ids
}

// firstStartPeers lists, per other node of the file, the groups this node
// shares with it: the meta group (every node of a new cluster bootstraps
// it) and the shards of which both are voters.
func (n *Node) firstStartPeers() map[string][]string {
	out := map[string][]string{}
	for _, id := range n.otherNodes() {
		out[id] = []string{MetaGroupID}
	}
	for _, s := range n.cfg.Topology.ShardsOnNode(n.cfg.NodeID) {
		for _, v := range s.Voters {
			if v != n.cfg.NodeID {
				out[v] = append(out[v], s.ID)
			}
		}
	}
	return out
}

// awaitFirstStart runs before this node bootstraps on an empty data dir:
// it answers its peers' questions and asks its own until every other node
// answered (see above), and refuses with ErrStateLost when one holds state
// that did not start with this node. A node without peers (--dev, a
// one-node cluster) bootstraps at once.
func (n *Node) awaitFirstStart(ctx context.Context) error {
	peers := n.firstStartPeers()
	if len(peers) == 0 {
		return nil
	}
	fs := &firstStartServer{asked: map[string]bool{}, version: n.cfg.Version}
	stop, err := n.serveFirstStart(fs)
	if err != nil {
		return err
	}
	defer stop()
	ids := slices.Sorted(maps.Keys(peers))
	fs.setWaiting(ids)
	n.log.Info("first start: asking the other nodes whether they hold Raft state before bootstrapping", "peers", strings.Join(ids, ","))
	answered := map[string]bool{}
	var waiting []string
	return pollPeers(ctx, func() (bool, error) {
		waiting = waiting[:0]
		for _, id := range ids {
			if answered[id] {
				continue
			}
			group, holds, err := n.peerHoldsState(ctx, id, peers[id])
			switch {
			case err != nil:
				waiting = append(waiting, id)
			case holds && !fs.wasAsked(id):
				return false, fmt.Errorf("%w: data dir %s is empty but node %s already holds Raft state of %s; "+
					"bootstrapping here would put a replica without its log and vote among voters that hold state, so this node refuses: "+
					"bring it back as a fresh replica with `idemctl replace-node --config FILE --id %s --data-dir %s`, or remove it with a topology change (idemctl topology apply)",
					ErrStateLost, n.cfg.DataDir, id, groupName(group), n.cfg.NodeID, n.cfg.DataDir)
			default: // empty, or it bootstrapped after seeing this node empty
				answered[id] = true
			}
		}
		fs.setWaiting(waiting)
		if len(waiting) == 0 {
			n.log.Info("first start: every other node answered; bootstrapping", "peers", strings.Join(ids, ","))
			return true, nil
		}
		return false, nil
	}, func() {
		n.log.Warn("first start: waiting for nodes that have not answered (they may hold state, so this node does not bootstrap without them)",
			"waiting_for", strings.Join(waiting, ","))
	}, func() error {
		n.log.Info("first start: stopped while waiting", "waiting_for", strings.Join(waiting, ","))
		return fmt.Errorf("%w: nodes %s had not answered", errStoppedBeforeFirstStart, strings.Join(waiting, ","))
	})
}

// pollPeers runs ask every firstStartPoll until it is done or fails. While
// it waits it calls waiting every firstStartLogEvery (to say whom it waits
// for); when ctx ends it returns what stopped returns.
func pollPeers(ctx context.Context, ask func() (done bool, err error), waiting func(), stopped func() error) error {
	lastLog := time.Now()
	ticker := time.NewTicker(firstStartPoll)
	defer ticker.Stop()
	for {
		if done, err := ask(); done || err != nil {
			return err
		}
		if time.Since(lastLog) >= firstStartLogEvery {
			waiting()
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return stopped()
		case <-ticker.C:
		}
	}
}

// awaitJoin runs before a node starts on an empty data dir with a file of
// a later version than 1, which bootstraps nothing: the node is new to a
// running cluster (a change adds it), or it lost its data dir and was
// started again without idemctl replace-node. The second would put a
// replica without its log and vote among voters that count on both, so
// the node asks the other nodes of its file for the meta group's
// configuration: a node becomes a meta voter only once it held the meta
// group's entries (the mover promotes a learner that caught up, and a new
// cluster's meta voters bootstrap it), so a configuration that names this
// node a voter proves that it held state, and it refuses. It starts once a
// node that hosts the meta group answered without naming it a voter, and
// waits (serving the probes) while none does.
//
// A node that is a meta learner only (the meta group has at most five
// voters) is not told apart from a new one this way: see node/TOPOLOGY.md's
// limits.
func (n *Node) awaitJoin(ctx context.Context) error {
	ids := n.otherNodes()
	if len(ids) == 0 {
		return nil
	}
	fs := &firstStartServer{asked: map[string]bool{}, version: n.cfg.Version,
		waitsFor: "start: waiting for a node that hosts the meta group to say whether this node held Raft state before"}
	stop, err := n.serveFirstStart(fs)
	if err != nil {
		return err
	}
	defer stop()
	fs.setWaiting(ids)
	return pollPeers(ctx, func() (bool, error) {
		answer, stop := n.statesOf(ctx, ids, MetaGroupID, nil)
		defer stop()
		var heard []string
		for i, id := range ids {
			st, err := answer(i)
			if err != nil || !st.hosted || len(st.members) == 0 {
				continue
			}
			if slices.ContainsFunc(st.members, func(m raftstore.Member) bool { return m.ID == n.cfg.NodeID && m.Voter }) {
				return false, fmt.Errorf("%w: data dir %s is empty but node %s counts this node as a voter of the meta group, which it became only after holding state; "+
					"starting here would put a replica without its log and vote among voters that count on them, so this node refuses: "+
					"bring it back as a fresh replica with `idemctl replace-node --config FILE --id %s --data-dir %s`",
					ErrStateLost, n.cfg.DataDir, id, n.cfg.NodeID, n.cfg.DataDir)
			}
			heard = append(heard, id)
		}
		if len(heard) == 0 {
			return false, nil
		}
		n.log.Info("start on an empty data dir: no node counts this one as a meta voter; joining as a new node", "asked", strings.Join(heard, ","))
		return true, nil
	}, func() {
		n.log.Warn("start on an empty data dir: waiting for a node that hosts the meta group (this node may have held state, so it does not start without knowing)",
			"nodes", strings.Join(ids, ","))
	}, func() error {
		return fmt.Errorf("%w: no node hosting the meta group had answered", errStoppedBeforeFirstStart)
	})
}

func groupName(id string) string {
	if id == MetaGroupID {
		return "the meta group"
	}
	return "shard " + id
}

// peerHoldsState asks node id about each of groups: holds is true, with
// the group, when it hosts one with state (a configuration, or applied or
// committed entries).
func (n *Node) peerHoldsState(ctx context.Context, id string, groups []string) (group string, holds bool, err error) {
	ctx = metadata.AppendToOutgoingContext(ctx, firstStartMetadata, n.cfg.NodeID)
	for _, g := range groups {
		st, err := n.shardStateOf(ctx, id, g, nil)
		if err != nil {
			return "", false, err
		}
		if st.hosted && (len(st.members) > 0 || st.applied > 0 || st.commit > 0) {
			return g, true, nil
		}
	}
	return "", false, nil
}

// serveFirstStart serves, until stop: fs on this node's gRPC address, and
// the probes on its HTTP address (/healthz 200, /readyz and everything else
// 503 naming the nodes it waits for), so a supervisor sees a live process.
// stop releases both addresses for the node's API.
func (n *Node) serveFirstStart(fs *firstStartServer) (stop func(), err error) {
	ln, err := n.cfg.Security.ListenGRPC(cmp.Or(n.cfg.GRPCAddr, n.self.GRPCAddr))
	if err != nil {
		return nil, fmt.Errorf("node: grpc listener: %w", err)
	}
	hln, err := n.cfg.Security.ListenAPI(cmp.Or(n.cfg.HTTPAddr, n.self.HTTPAddr))
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("node: http listener: %w", err)
	}
	srv := grpc.NewServer(n.cfg.Security.GRPCServerOptions()...)
	idemv1.RegisterTopologyServer(srv, fs)
	probes := serving.HTTPWithTimeouts("node: http (first start)", hln, http.HandlerFunc(fs.serveHTTP), n.log, n.cfg.Security.HTTPTimeouts())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	wg.Go(func() { _ = probes.Serve() })
	return func() {
		srv.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = probes.Drain(ctx)
		wg.Wait()
	}, nil
}

// serveHTTP answers the probes while the node waits to bootstrap.
func (f *firstStartServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if r.URL.Path == "/healthz" {
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok", "version": f.version})
		return
	}
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	msg := cmp.Or(f.waitsFor, "first start: waiting for the other nodes to answer that they hold no Raft state before bootstrapping")
	if waiting := f.waitingFor(); waiting != "" {
		msg += " (not answered yet: " + waiting + ")"
	}
	_ = json.NewEncoder(w).Encode(map[string]map[string]string{"error": {"code": string(contract.CodeUnavailable), "message": msg}})
}

// firstStartServer answers ShardState while this node waits to bootstrap:
// it hosts nothing yet. It records the nodes that asked in the same
// situation (firstStartMetadata).
type firstStartServer struct {
	idemv1.UnimplementedTopologyServer
	version  string // for /healthz
	waitsFor string // what /readyz says it waits for (first start's wait when empty)
	mu       sync.Mutex
	asked    map[string]bool
	waiting  string // the nodes not answered yet, for /readyz
}

func (f *firstStartServer) setWaiting(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waiting = strings.Join(ids, ",")
}

func (f *firstStartServer) waitingFor() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting
}

func (f *firstStartServer) ShardState(ctx context.Context, _ *idemv1.ShardStateRequest) (*idemv1.ShardStateResponse, error) {
	if !auth.FromNodePeer(ctx) {
		return nil, status.Error(codes.PermissionDenied, "ShardState answers node peers only")
	}
	if id := firstStartAsker(ctx); id != "" {
		f.mu.Lock()
		f.asked[id] = true
		f.mu.Unlock()
	}
	return &idemv1.ShardStateResponse{}, nil
}

func (f *firstStartServer) wasAsked(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked[id]
}

// firstStartAsker is the node a first-start ShardState came from: the
// metadata's id, which over TLS must be the node certificate's name;
// "" for an ordinary ShardState.
func firstStartAsker(ctx context.Context) string {
	v := metadata.ValueFromIncomingContext(ctx, firstStartMetadata)
	if len(v) == 0 {
		return ""
	}
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			if id := auth.PeerIdentity(&info.State); id.Kind != pki.KindNode || id.Name != v[0] {
				return ""
			}
		}
	}
	return v[0]
}
