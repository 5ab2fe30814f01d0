// Package datadir is a node's data dir identity: the file that says which
// cluster, node and ring a data dir belongs to, checked on every start, and
// the rejoin marker idemctl replace-node leaves. It is a leaf (the standard
// library and internal/durable) so that idemctl can prepare a data dir
// without linking the node.
package datadir

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/idem-dev/idem/internal/durable"
)

// IdentityFile records which cluster, node and ring a data dir belongs to.
const IdentityFile = "idem-identity.json"

// ErrMismatch: the data dir belongs to another cluster, node or ring, or
// was not made by idem.
var ErrMismatch = errors.New("datadir: data dir does not match this node")

// Identity is written once, when a data dir is first used, and checked on
// every later start so a data dir is never mixed into another cluster or a
// changed ring (which would strand records on shards that no longer own them).
// Its presence also says that this dir held Raft state: a later start whose
// state is missing refuses (ErrStateLost) instead of bootstrapping again.
type Identity struct {
	Cluster         string    `json:"cluster"`
	NodeID          string    `json:"node_id"`
	RingFingerprint string    `json:"ring_fingerprint"`
	CreatedAt       time.Time `json:"created_at"`
	// Rejoining is set by idemctl replace-node (PrepareRejoin): the dir was
	// emptied and the node comes back as a fresh replica, so a group with no
	// state waits to be added by its leader (raftstore.StartJoin) instead of
	// refusing. The node clears it once every group has caught up.
	Rejoining bool `json:"rejoining,omitempty"`
}

// Check creates dir and its identity file, or verifies that an
// existing one matches want. It returns the identity on disk and whether
// the file existed before (the dir held state). An identity that recorded
// one of formerRings (what an older release pinned for the same ring) is
// rewritten to want's.
func Check(dir string, want Identity, formerRings ...string) (Identity, bool, error) {
	if err := mkdirDurable(dir); err != nil {
		return Identity{}, false, fmt.Errorf("datadir: %w", err)
	}
	path := filepath.Join(dir, IdentityFile)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		entries, err := os.ReadDir(dir)
		if err != nil {
			return Identity{}, false, fmt.Errorf("datadir: %w", err)
		}
		if len(entries) > 0 {
			return Identity{}, false, fmt.Errorf("%w: %s is not empty but has no %s; it was not created by idem (or by an older version): use an empty --data-dir",
				ErrMismatch, dir, IdentityFile)
		}
		want.CreatedAt = time.Now().UTC()
		return want, false, WriteFile(path, want)
	case err != nil:
		return Identity{}, false, fmt.Errorf("datadir: %w", err)
	}
	var have Identity
	if err := json.Unmarshal(data, &have); err != nil {
		return Identity{}, true, fmt.Errorf("%w: %s is unreadable (%v)", ErrMismatch, path, err)
	}
	if have.RingFingerprint != want.RingFingerprint && slices.Contains(formerRings, have.RingFingerprint) &&
		have.Cluster == want.Cluster && have.NodeID == want.NodeID {
		have.RingFingerprint = want.RingFingerprint
		if err := WriteFile(path, have); err != nil {
			return Identity{}, true, err
		}
	}
	var problems []error
	if have.Cluster != want.Cluster {
		problems = append(problems, fmt.Errorf("it belongs to cluster %q, the topology names %q", have.Cluster, want.Cluster))
	}
	if have.NodeID != want.NodeID {
		problems = append(problems, fmt.Errorf("it belongs to node %q, this is node %q", have.NodeID, want.NodeID))
	}
	if have.RingFingerprint != want.RingFingerprint {
		problems = append(problems, fmt.Errorf("it was created with key layout %s, the topology now gives %s (the cluster name or the ring section changed, which moves every key; change nodes, shards and regions online with idemctl topology apply)",
			have.RingFingerprint, want.RingFingerprint))
	}
	if len(problems) > 0 {
		return Identity{}, true, fmt.Errorf("%w: refusing to start on %s: %w; restore the original topology file or use a fresh --data-dir",
			ErrMismatch, dir, errors.Join(problems...))
	}
	return have, true, nil
}

// ReadFile reads the JSON file at path into v, as WriteFile wrote it;
// false without error when there is no such file (v is then untouched).
func ReadFile(path string, v any) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("datadir: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return true, fmt.Errorf("datadir: %s: %w", path, err)
	}
	return true, nil
}

// WriteFile writes v as JSON to path through a temporary file, fsyncs
// it, renames it into place and fsyncs the directory, so the file is either
// the old or the new one after a crash, and its entry is durable.
func WriteFile(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("datadir: %w", err)
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("datadir: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("datadir: fsync of %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("datadir: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("datadir: %w", err)
	}
	return syncDir(filepath.Dir(path))
}

// syncDir fsyncs a directory, making the entries created in it durable.
func syncDir(dir string) error {
	if err := durable.SyncDir(dir); err != nil {
		return fmt.Errorf("datadir: %w", err)
	}
	return nil
}

// mkdirDurable creates dir (and missing parents) durably.
func mkdirDurable(dir string) error { return durable.MkdirAll(dir, 0o755) }

// PrepareRejoin empties dataDir (which must belong to node nodeID of cluster
// with ring ringFingerprint, or be empty or missing) and writes an identity
// marked Rejoining, so the node's next start joins its groups as a fresh
// replica (raftstore.StartJoin) instead of refusing on lost state. The node
// must be stopped; idemctl replace-node checks that first. Use it only
// together with the leaders' ReplaceVoter (idemctl replace-node does both).
func PrepareRejoin(dataDir, cluster, nodeID, ringFingerprint string) error {
	want := Identity{Cluster: cluster, NodeID: nodeID, RingFingerprint: ringFingerprint}
	if data, err := os.ReadFile(filepath.Join(dataDir, IdentityFile)); err == nil {
		var have Identity
		if json.Unmarshal(data, &have) == nil && (have.Cluster != cluster || have.NodeID != nodeID) {
			return fmt.Errorf("%w: %s belongs to node %q of cluster %q, not %q of %q: refusing to empty it",
				ErrMismatch, dataDir, have.NodeID, have.Cluster, nodeID, cluster)
		}
	}
	entries, err := os.ReadDir(dataDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("datadir: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
			return fmt.Errorf("datadir: emptying %w", err)
		}
	}
	if err := mkdirDurable(dataDir); err != nil {
		return fmt.Errorf("datadir: %w", err)
	}
	if err := syncDir(dataDir); err != nil { // the removals
		return err
	}
	want.CreatedAt = time.Now().UTC()
	want.Rejoining = true
	return WriteFile(filepath.Join(dataDir, IdentityFile), want)
}
