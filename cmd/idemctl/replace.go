package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/internal/datadir"
	"github.com/idem-dev/idem/topology"
)

// replaceView is what replace-node prints.
type replaceView struct {
	Node    string         `json:"node"`
	DataDir string         `json:"data_dir"`
	Shards  []replacedView `json:"shards"`
}

type replacedView struct {
	Shard  string `json:"shard"`
	Leader string `json:"leader"`
}

// replaceAttempts bounds how often replace-node looks for a shard's leader
// again after the one it asked stepped down.
const replaceAttempts = 5

func runReplaceNode(ctx context.Context, e *env, _ []string) error {
	topo, err := e.needTopology("replace-node")
	if err != nil {
		return err
	}
	id := e.o.id
	if id == "" {
		return errors.New("replace-node needs --id NODE, the node to bring back")
	}
	self, ok := topo.NodeByID(id)
	if !ok {
		return fmt.Errorf("--id %q is not a node of cluster %q", id, topo.Cluster)
	}
	dataDir := cmp.Or(e.o.dataDir, filepath.Join("idem-data", id))
	if err := checkStopped(self, dataDir); err != nil {
		return err
	}
	ring, err := topology.NewRing(topo)
	if err != nil {
		return err
	}
	shards := topo.ShardsOnNode(id)
	// Check every shard has a leader before touching the dir: the node
	// cannot come back without them.
	leaders := map[string]string{}
	var missing []string
	for _, s := range shards {
		if l := findLeader(ctx, e, s).Leader; l != "" && l != id {
			leaders[s.ID] = l
		} else {
			missing = append(missing, s.ID)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("shard(s) %s have no leader among the other voters: a replica can only be rebuilt from a live leader (see idemctl status); nothing was changed",
			strings.Join(missing, ", "))
	}
	if err := datadir.PrepareRejoin(dataDir, topo.Cluster, id, ring.LayoutFingerprint()); err != nil {
		return err
	}
	v := replaceView{Node: id, DataDir: dataDir, Shards: []replacedView{}}
	for _, s := range shards {
		leader, err := replaceVoter(ctx, e, s, id, leaders[s.ID])
		if err != nil {
			return fmt.Errorf("%s emptied and marked to rejoin, but shard %s: %w; run replace-node again (it is safe to repeat)", dataDir, s.ID, err)
		}
		v.Shards = append(v.Shards, replacedView{Shard: s.ID, Leader: leader})
	}
	// The meta group (the replicated topology): every node is a member.
	metaLeader, err := replaceMetaMember(ctx, e, topo, id)
	if err != nil {
		return fmt.Errorf("%s emptied and marked to rejoin, but the meta group: %w; run replace-node again (it is safe to repeat)", dataDir, err)
	}
	v.Shards = append(v.Shards, replacedView{Shard: "meta", Leader: metaLeader})
	if e.g.json {
		return writeJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "%s: emptied %s; replaced as a voter of %d shard(s):\n", id, dataDir, len(v.Shards))
	for _, r := range v.Shards {
		fmt.Fprintf(e.stdout, "  shard %s by leader %s\n", r.Shard, r.Leader)
	}
	fmt.Fprintf(e.stdout, "start the node now (same --config, --id and --data-dir): it catches up from its peers\n")
	return nil
}

// replaceVoter asks the shard's leader to replace voter id, following the
// leadership if it moves.
func replaceVoter(ctx context.Context, e *env, s topology.Shard, id, leader string) (string, error) {
	var last error
	for range replaceAttempts {
		if leader == "" || leader == id {
			leader = findLeader(ctx, e, s).Leader
		}
		if leader != "" && leader != id {
			client, closeConn, err := adminClient(e, e.topo, leader)
			if err != nil {
				return "", err
			}
			// A configuration change commits twice (removal, re-add).
			cctx, cancel := context.WithTimeout(ctx, 3*e.g.timeout)
			resp, err := client.ReplaceVoter(cctx, &idemv1.ReplaceVoterRequest{Shard: s.ID, NodeId: id})
			cancel()
			closeConn()
			if err == nil {
				return resp.GetLeaderId(), nil
			}
			last = fmt.Errorf("on %s: %s", leader, reason(err))
			if c := status.Code(err); c != codes.FailedPrecondition && c != codes.Unavailable && c != codes.DeadlineExceeded {
				return "", last
			}
		} else {
			last = errors.New("no leader known")
		}
		leader = ""
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(500 * time.Millisecond): // let an election settle
		}
	}
	return "", last
}

// replaceMetaMember asks the other nodes until the meta group's leader
// replaces id in it.
func replaceMetaMember(ctx context.Context, e *env, topo *topology.Topology, id string) (string, error) {
	var last error
	for range replaceAttempts {
		for _, n := range topo.Nodes() {
			if n.ID == id {
				continue
			}
			client, closeConn, err := adminClient(e, topo, n.ID)
			if err != nil {
				return "", err
			}
			cctx, cancel := context.WithTimeout(ctx, 3*e.g.timeout)
			resp, err := client.ReplaceVoter(cctx, &idemv1.ReplaceVoterRequest{Shard: "meta", NodeId: id})
			cancel()
			closeConn()
			if err == nil {
				return resp.GetLeaderId(), nil
			}
			last = fmt.Errorf("on %s: %s", n.ID, reason(err))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return "", last
}

// checkStopped refuses while the node runs: its Raft port answers, or its
// pebble log's LOCK file is locked by a process.
func checkStopped(n topology.Node, dataDir string) error {
	if conn, err := net.DialTimeout("tcp", n.RaftAddr, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("node %s is running (its Raft port %s answers): stop it first; replace-node empties its data dir", n.ID, n.RaftAddr)
	}
	lockFile := filepath.Join(dataDir, "raft", "raftlog", "LOCK")
	return withFile(lockFile, func(f *os.File) error {
		// pebble holds a POSIX (fcntl) write lock on LOCK while open.
		lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: 0, Len: 0}
		if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil {
			return fmt.Errorf("checking %s: %w", lockFile, err)
		}
		if lk.Type != syscall.F_UNLCK {
			return fmt.Errorf("%s is locked by running process %d: stop node %s first", lockFile, lk.Pid, n.ID)
		}
		return nil
	})
}

// withFile runs fn on path opened for reading and writing; a missing file
// is no error.
func withFile(path string, fn func(*os.File) error) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking %s: %w", path, err)
	}
	defer f.Close()
	return fn(f)
}
