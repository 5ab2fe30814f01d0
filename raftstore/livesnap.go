package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/raft"
)

// ErrReferenceAhead: a reference snapshot covers more of the log than the
// state on disk it refers to (the state lost writes it had synced, or was
// replaced); the node cannot rebuild its state by itself.
var ErrReferenceAhead = errors.New("raftstore: reference snapshot ahead of the state on disk")

// liveSnapshotStore is a group's file snapshot store when its state machine
// is a LiveSnapshotter: it stores reference snapshots (a 13-byte header) as
// raft writes them, and Open turns one into a full (version 4) snapshot of
// the live state, streamed from a LiveSnapshot without holding it in memory.
// Full snapshots (a data dir of an earlier release, or one a leader sent)
// open as they are.
type liveSnapshotStore struct {
	*raft.FileSnapshotStore
	live LiveSnapshotter
}

var _ raft.SnapshotStore = (*liveSnapshotStore)(nil)

func (s *liveSnapshotStore) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.FileSnapshotStore.Open(id)
	if err != nil {
		return nil, nil, err
	}
	h := make([]byte, snapHeaderLen)
	if _, err := io.ReadFull(rc, h); err != nil {
		rc.Close()
		return nil, nil, fmt.Errorf("raftstore: reading snapshot %s header: %w", id, err)
	}
	if [4]byte(h[:4]) != snapMagic || h[4] != snapVersionRef {
		return meta, struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(h), rc), rc}, nil
	}
	rc.Close()
	ref := binary.BigEndian.Uint64(h[5:])
	w, applied, err := s.live.LiveSnapshot()
	if err != nil {
		return nil, nil, fmt.Errorf("raftstore: snapshot %s: capturing the state: %w", id, err)
	}
	if applied < ref {
		w.Release()
		return nil, nil, fmt.Errorf("%w: snapshot %s refers to the state at index %d, the state on disk covers %d", ErrReferenceAhead, id, ref, applied)
	}
	// raft sends a snapshot's size before its bytes: measure it by writing
	// the view once to nowhere (the view is a point-in-time snapshot, so
	// the second pass writes the same bytes).
	n, err := w.WriteTo(io.Discard)
	if err != nil {
		w.Release()
		return nil, nil, fmt.Errorf("raftstore: snapshot %s: measuring the state: %w", id, err)
	}
	m := *meta
	m.Size = snapSummedLen + n
	pr, pw := io.Pipe()
	go func() {
		defer w.Release()
		if _, err := pw.Write(fullSnapHeader(applied)); err != nil {
			pw.CloseWithError(err)
			return
		}
		k, err := w.WriteTo(pw)
		if err == nil && k != n {
			err = fmt.Errorf("raftstore: snapshot %s: the state wrote %d bytes, measured %d", id, k, n)
		}
		pw.CloseWithError(err) // nil: EOF
	}()
	return &m, pr, nil
}
