// Package durable makes directory entries survive a crash: a file created
// (or renamed) in a directory is only durable once the directory itself was
// fsynced, and a new directory only once its parent was. It is the one home
// of that rule for node (data dir, staged files), internal/datadir (identity
// file) and raftstore (log and shard dirs); it imports nothing of idem, so
// raftstore may use it (ARCHITECTURE.md's rules).
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SyncDir fsyncs directory dir, making the entries created in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync of directory %s: %w", dir, err)
	}
	return nil
}

// MkdirAll creates dir and any missing parents with perm, and fsyncs the
// parent of each directory it created.
func MkdirAll(dir string, perm fs.FileMode) error {
	dir = filepath.Clean(dir)
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAll(parent, perm); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return SyncDir(parent)
}
