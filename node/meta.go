package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/idem-dev/idem/raftstore"
	"github.com/idem-dev/idem/topology"
)

// MetaGroupID is the id of the meta group, the Raft group every node of
// the cluster is a member of (a few voters, every other node a non-voting
// member: topology.MetaMembers) and which replicates the cluster's active
// topology and the target of a running change. It cannot collide with a
// shard id, which always ends in "-<index>".
const MetaGroupID = "meta"

// metaCommand is one replicated change of the meta state, JSON-encoded in
// the meta group's log.
type metaCommand struct {
	// Op is "init" (record the first active topology, once), "target"
	// (store the target of a change), "activate" (the change is done: the
	// target becomes the active topology) or "progress" (a step of the
	// running change was taken at At), "moved" (Partitions of the running
	// change's Version now live in their target shard).
	Op       string          `json:"op"`
	Topology json.RawMessage `json:"topology,omitempty"`
	Dead     []string        `json:"dead,omitempty"`
	Version  int             `json:"version,omitempty"`
	At       int64           `json:"at,omitempty"` // unix nanos, the proposer's clock
	// Partitions (moved) are ring partitions, ascending.
	Partitions []uint32 `json:"partitions,omitempty"`
	// ClusterVersion ("cluster-version") raises the cluster version to it;
	// one at or below the stored version changes nothing.
	ClusterVersion int `json:"cluster_version,omitempty"`
	// Source, Dest and Nonce ("batch", with Version and Partitions) record
	// the running change's next batch, or a new attempt of the recorded
	// one, tagged with the driver's nonce.
	Source string `json:"source,omitempty"`
	Dest   string `json:"dest,omitempty"`
	Nonce  uint64 `json:"nonce,omitempty"`
}

// metaBatch is the batch of partitions the running change moves now, as
// the meta group recorded it before its first freeze (handoff.Batch).
type metaBatch struct {
	Source     string   `json:"source"`
	Dest       string   `json:"dest"`
	Partitions []uint32 `json:"partitions"`
	// Attempt is the meta log index of the entry that recorded the
	// attempt moving it now: every attempt's is higher than the last's.
	Attempt uint64 `json:"attempt"`
	// Nonce is the recording driver's tag for the attempt.
	Nonce uint64 `json:"nonce"`
}

// metaRecord is the meta state as stored in snapshots.
type metaRecord struct {
	Active        json.RawMessage `json:"active,omitempty"`
	Target        json.RawMessage `json:"target,omitempty"`
	Dead          []string        `json:"dead,omitempty"`
	ChangeStarted int64           `json:"change_started,omitempty"`
	LastProgress  int64           `json:"last_progress,omitempty"`
	// Left lists the nodes the last change removed: they may be stopped.
	Left []string `json:"left,omitempty"`
	// Moved lists the ring partitions the running change has moved to
	// their target shard, ascending; the others are still where the
	// active topology puts them.
	Moved []uint32 `json:"moved,omitempty"`
	// ClusterVersion is the cluster version (version.go); 0 until the
	// meta group's leader first raised it (VersionBaseline).
	ClusterVersion int `json:"cluster_version,omitempty"`
	// Batch is the running change's batch being moved (nil: none).
	Batch *metaBatch `json:"batch,omitempty"`
}

// metaView is a consistent read of the meta state. active is nil until
// the meta group applied its first "init".
type metaView struct {
	active, target              *topology.Topology
	dead, left                  []string
	changeStarted, lastProgress int64
	applied                     uint64
	// moved is the set of partitions the running change moved (shared,
	// read-only).
	moved map[uint32]bool
	// clusterVersion is the stored cluster version (0: none yet, read as
	// VersionBaseline by effectiveVersion).
	clusterVersion int
	// batch is the batch being moved (nil: none; shared, read-only).
	batch *metaBatch
}

// voters returns shard id's voters in the active topology, then those
// only the target gives it: whom to ask for the shard's leader while a
// change runs.
func (mv metaView) voters(id string) []string {
	var out []string
	for _, t := range []*topology.Topology{mv.active, mv.target} {
		if t == nil {
			continue
		}
		if s, ok := t.ShardByID(id); ok {
			for _, v := range s.Voters {
				if !slices.Contains(out, v) {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// metaSM is the meta group's state machine: small, in memory, rebuilt from
// its snapshot and log on every start.
type metaSM struct {
	mu      sync.Mutex
	rec     metaRecord
	view    metaView
	changed chan struct{} // closed and replaced on every applied change
}

func newMetaSM() *metaSM { return &metaSM{changed: make(chan struct{})} }

// read returns the current meta state and a channel closed at its next
// change.
func (m *metaSM) read() (metaView, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.view, m.changed
}

func parseStored(raw json.RawMessage) (*topology.Topology, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	return topology.Parse(raw)
}

// Apply implements raftstore.StateMachine. It returns nil or the error
// that refused the command; a refused command changes nothing.
func (m *metaSM) Apply(index uint64, data []byte) any {
	var cmd metaCommand
	if err := json.Unmarshal(data, &cmd); err != nil {
		return fmt.Errorf("meta: undecodable command at index %d: %w", index, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.view.applied = index
	rec := m.rec
	switch cmd.Op {
	case "init":
		if len(rec.Active) > 0 {
			return nil // the first init won; a later one is a restart's
		}
		rec.Active = cmd.Topology
	case "target":
		next, err := topology.Parse(cmd.Topology)
		if err != nil {
			return err
		}
		if m.view.active == nil {
			return errors.New("the cluster has no active topology yet: wait until every node started once")
		}
		if m.view.target != nil {
			if topology.SameShape(m.view.target, next) {
				return nil // the same change again: a resumed apply
			}
			return &changeRunningError{version: m.view.target.EffectiveVersion()}
		}
		if err := checkTarget(m.view.active, next, cmd.Dead); err != nil {
			return err
		}
		rec.Target, rec.Dead, rec.ChangeStarted, rec.LastProgress, rec.Left, rec.Moved, rec.Batch = cmd.Topology, slices.Clone(cmd.Dead), cmd.At, cmd.At, nil, nil, nil
	case "activate":
		if m.view.target == nil || m.view.target.EffectiveVersion() != cmd.Version {
			return nil // already activated: a repeated step
		}
		var left []string
		for _, nd := range m.view.active.Nodes() {
			if _, ok := m.view.target.NodeByID(nd.ID); !ok {
				left = append(left, nd.ID)
			}
		}
		rec.Active, rec.Target, rec.Dead, rec.ChangeStarted, rec.LastProgress, rec.Left, rec.Moved, rec.Batch = rec.Target, nil, nil, 0, 0, left, nil, nil
	case "moved":
		if m.view.target == nil || m.view.target.EffectiveVersion() != cmd.Version {
			return fmt.Errorf("meta: partitions moved for version %d, the running change is %d", cmd.Version, versionOf(m.view.target))
		}
		moved := slices.Clone(rec.Moved)
		for _, p := range cmd.Partitions {
			if !m.view.moved[p] {
				moved = append(moved, p)
			}
		}
		slices.Sort(moved)
		rec.Moved = moved
		if b := rec.Batch; b != nil && slices.Equal(b.Partitions, cmd.Partitions) {
			rec.Batch = nil // the batch is done
		}
	case "batch":
		if m.view.target == nil || m.view.target.EffectiveVersion() != cmd.Version {
			return fmt.Errorf("meta: a batch for version %d, the running change is %d", cmd.Version, versionOf(m.view.target))
		}
		if b := rec.Batch; b != nil && (b.Source != cmd.Source || b.Dest != cmd.Dest || !slices.Equal(b.Partitions, cmd.Partitions)) {
			return fmt.Errorf("meta: a batch of %d partitions %s -> %s is being moved; another cannot start before it is recorded as moved",
				len(b.Partitions), b.Source, b.Dest)
		}
		if len(cmd.Partitions) == 0 || !slices.IsSorted(cmd.Partitions) || cmd.Source == "" || cmd.Dest == "" || cmd.Nonce == 0 {
			return errors.New("meta: a batch names its source, destination, nonce and ascending partitions")
		}
		for _, p := range cmd.Partitions {
			if m.view.moved[p] {
				return fmt.Errorf("meta: partition %d is moved already", p)
			}
		}
		rec.Batch = &metaBatch{Source: cmd.Source, Dest: cmd.Dest, Partitions: slices.Clone(cmd.Partitions), Attempt: index, Nonce: cmd.Nonce}
	case "cluster-version":
		if cmd.ClusterVersion <= rec.ClusterVersion {
			return nil // never lower; a repeated raise
		}
		rec.ClusterVersion = cmd.ClusterVersion
	case "progress":
		if m.view.target != nil && cmd.At > rec.LastProgress {
			rec.LastProgress = cmd.At
		}
	default:
		return fmt.Errorf("meta: unknown command %q", cmd.Op)
	}
	return m.set(rec, index)
}

// set installs rec (parsed into the view) and wakes readers. Holds m.mu.
func (m *metaSM) set(rec metaRecord, applied uint64) error {
	active, err := parseStored(rec.Active)
	if err != nil {
		return fmt.Errorf("meta: stored active topology: %w", err)
	}
	target, err := parseStored(rec.Target)
	if err != nil {
		return fmt.Errorf("meta: stored target topology: %w", err)
	}
	m.rec = rec
	moved := make(map[uint32]bool, len(rec.Moved))
	for _, p := range rec.Moved {
		moved[p] = true
	}
	m.view = metaView{active: active, target: target, dead: rec.Dead, left: rec.Left, changeStarted: rec.ChangeStarted, lastProgress: rec.LastProgress,
		applied: applied, moved: moved, clusterVersion: rec.ClusterVersion, batch: rec.Batch}
	close(m.changed)
	m.changed = make(chan struct{})
	return nil
}

type metaSnapshot struct{ data []byte }

func (s metaSnapshot) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(s.data)
	return int64(n), err
}

func (metaSnapshot) Release() {}

// Snapshot implements raftstore.StateMachine.
func (m *metaSM) Snapshot() (raftstore.SnapshotWriter, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	data, err := json.Marshal(m.rec)
	if err != nil {
		return nil, err
	}
	return metaSnapshot{data: data}, nil
}

// Restore implements raftstore.StateMachine.
func (m *metaSM) Restore(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	var rec metaRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return fmt.Errorf("meta: snapshot: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set(rec, m.view.applied)
}

// changeRunningError refuses a second, different change while one runs.
type changeRunningError struct{ version int }

func (e *changeRunningError) Error() string {
	return fmt.Sprintf("a change to version %d is running: wait for it to finish (idemctl topology status) before applying another", e.version)
}
