package statedb

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/fsm"
)

// ErrStateFull: the node's stored state has reached its maximum
// (--max-state-bytes); requests that would add data are refused until
// sweeps free space. Returned as a *StateFullError.
var ErrStateFull = errors.New("statedb: stored state is at its maximum")

// StateFullError is an ErrStateFull with the figures.
type StateFullError struct {
	Used, Max int64
}

func (e *StateFullError) Error() string {
	return fmt.Sprintf("%v (%d of %d bytes): requests that add data are refused until expired records are swept", ErrStateFull, e.Used, e.Max)
}

// Unwrap makes errors.Is(err, ErrStateFull) hold.
func (e *StateFullError) Unwrap() error { return ErrStateFull }

// DefaultMaxStateBytes is the default limit for a data dir: 80% of the free
// space of its filesystem now.
func DefaultMaxStateBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statedb: free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize) / 10 * 8, nil
}

// StateBytes is the stored state of every open shard: the sum of their
// records' sizes (fsm.Stats().Bytes) as committed. It falls at once when a
// sweep drops records (the engine's files shrink only after compaction), so
// writes resume as soon as space is logically free.
func (d *DB) StateBytes() int64 { return d.stateBytes.Load() }

// full returns the error to refuse an adding request with, or nil.
func (d *DB) full() error {
	max := d.maxBytes
	if max <= 0 {
		return nil
	}
	if used := d.stateBytes.Load(); used >= max {
		return &StateFullError{Used: used, Max: max}
	}
	return nil
}

// Admit decides, before cmd is proposed, whether it may be: while the
// node's state is at its maximum, a reserve of a key that holds no live
// record and a complete of a key not yet completed are refused with a
// *StateFullError; replays, reserves of held keys, heartbeats, releases and
// sweeps always pass. The decision reads this node's state, which is how it
// stays out of the replicated log: what is refused is never proposed, so
// every replica applies the same log. (A key that expires between Admit
// and apply adds one record over the limit: the limit is approximate by
// that much.)
func (m *StateMachine) Admit(cmd *fsm.Command) error {
	err := m.db.full()
	if err == nil {
		return nil
	}
	switch cmd.Op {
	case fsm.OpReserve:
		if _, ok := m.f.Get(cmd.Namespace, cmd.Key, cmd.Now); ok {
			return nil
		}
	case fsm.OpComplete:
		if rec, ok := m.f.Get(cmd.Namespace, cmd.Key, cmd.Now); ok && rec.State == fsm.StateCompleted {
			return nil // a retried complete: answered from the record
		}
	default:
		return nil
	}
	m.db.refused.Inc()
	return err
}

func (d *DB) registerMetrics(reg *prometheus.Registry) error {
	d.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "idem_state_full_rejections_total",
		Help: "Requests refused with RESOURCE_EXHAUSTED because the node's stored state was at --max-state-bytes.",
	})
	if reg == nil {
		return nil
	}
	gauges := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_state_bytes",
			Help: "Stored state of the node's shards (sum of record sizes), compared with --max-state-bytes."},
			func() float64 { return float64(d.StateBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_state_max_bytes",
			Help: "The node's --max-state-bytes (0: no limit)."},
			func() float64 { return float64(d.maxBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_state_disk_bytes",
			Help: "Size of the node's state engine on disk."},
			func() float64 { return float64(d.DiskBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_state_full",
			Help: "1 while the node's stored state is at --max-state-bytes and adding requests are refused."},
			func() float64 {
				if d.full() != nil {
					return 1
				}
				return 0
			}),
		d.refused,
	}
	for _, c := range gauges {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("statedb: registering metrics: %w", err)
		}
	}
	return nil
}
