package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// identityFile records which cluster, node and ring a data dir belongs to.
const identityFile = "idem-identity.json"

// identity is written once, when a data dir is first used, and checked on
// every later start so a data dir is never mixed into another cluster or a
// changed ring (which would strand records on shards that no longer own them).
type identity struct {
	Cluster         string    `json:"cluster"`
	NodeID          string    `json:"node_id"`
	RingFingerprint string    `json:"ring_fingerprint"`
	CreatedAt       time.Time `json:"created_at"`
}

// checkIdentity creates dir and its identity file, or verifies that an
// existing one matches want.
func checkIdentity(dir string, want identity) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	path := filepath.Join(dir, identityFile)
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("node: data dir: %w", err)
		}
		if len(entries) > 0 {
			return fmt.Errorf("%w: %s is not empty but has no %s; it was not created by idem (or by an older version): use an empty --data-dir",
				ErrDataDirMismatch, dir, identityFile)
		}
		want.CreatedAt = time.Now().UTC()
		return writeFileAtomic(path, want)
	case err != nil:
		return fmt.Errorf("node: data dir: %w", err)
	}
	var have identity
	if err := json.Unmarshal(data, &have); err != nil {
		return fmt.Errorf("%w: %s is unreadable (%v)", ErrDataDirMismatch, path, err)
	}
	var problems []error
	if have.Cluster != want.Cluster {
		problems = append(problems, fmt.Errorf("it belongs to cluster %q, the topology names %q", have.Cluster, want.Cluster))
	}
	if have.NodeID != want.NodeID {
		problems = append(problems, fmt.Errorf("it belongs to node %q, this is node %q", have.NodeID, want.NodeID))
	}
	if have.RingFingerprint != want.RingFingerprint {
		problems = append(problems, fmt.Errorf("it was created with ring %s, the topology now gives ring %s (shards, placement or ring parameters changed; re-homing records is not supported yet)",
			have.RingFingerprint, want.RingFingerprint))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: refusing to start on %s: %w; restore the original topology file or use a fresh --data-dir",
			ErrDataDirMismatch, dir, errors.Join(problems...))
	}
	return nil
}

func writeFileAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("node: data dir: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("node: data dir: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
