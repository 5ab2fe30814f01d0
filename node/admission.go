package node

import (
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

const (
	// DefaultMaxDiskReserve caps the default free-space reserve.
	DefaultMaxDiskReserve = 1 << 30
	// defaultDiskReservePercent is the default reserve as a share of the
	// data dir's filesystem.
	defaultDiskReservePercent = 5
	// admissionRetryAfter is the Retry-After of a refused write.
	admissionRetryAfter = 2 * time.Second
	// diskSampleEvery bounds how often the free space is read (statfs).
	diskSampleEvery = 500 * time.Millisecond
)

// admissionCheck is one reason a node may refuse writes that add data: it
// returns why ("" when there is room) and when to retry. Each runs on every
// such write, so it must be cheap (sample, don't scan).
type admissionCheck struct {
	name  string // the metric's reason label
	check func(s *shard, cmd *fsm.Command) (why string, retryAfter time.Duration)
}

// admission decides, on the leader before proposing, whether a write that
// adds data (a reserve of a key the shard holds no live record of, a
// complete of a key not yet completed) may be proposed. Everything else —
// reads, replays, heartbeats, releases, sweeps, operator actions — always
// is: it adds nothing, and refusing it would turn a full disk into an
// outage. A refusal is 429 RESOURCE_EXHAUSTED with Retry-After; writes
// resume by themselves once every check passes again. Its reasons: the
// data dir's free space below the reserve (disk_reserve), a voter of the
// shard reporting the same on its clock probe answer (peer_disk_reserve: it
// would fail stop on the next write it is sent), and the stored state at
// --max-state-bytes (max_state_bytes, statedb's Admit). What is
// refused is never proposed, so replicas still apply the same log.
type admission struct {
	checks  []admissionCheck
	refused *prometheus.CounterVec
}

func newAdmission() *admission {
	return &admission{refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_node_admission_refusals_total",
		Help: "Writes that would add data refused with 429 RESOURCE_EXHAUSTED, by reason."}, []string{"reason"})}
}

func (a *admission) addCheck(name string, check func(s *shard, cmd *fsm.Command) (string, time.Duration)) {
	a.checks = append(a.checks, admissionCheck{name: name, check: check})
	a.refused.WithLabelValues(name)
}

// addsData reports whether cmd (stamped) would add data to shard s.
func addsData(s *shard, cmd *fsm.Command) bool {
	switch cmd.Op {
	case fsm.OpReserve:
		_, held := s.fsm.Get(cmd.Namespace, cmd.Key, cmd.Now)
		return !held
	case fsm.OpComplete:
		rec, ok := s.fsm.Get(cmd.Namespace, cmd.Key, cmd.Now)
		return !ok || rec.State != fsm.StateCompleted // a retried complete is answered from the record
	}
	return false
}

// admit returns nil, or the 429 a data-adding write to s gets.
func (a *admission) admit(s *shard, cmd *fsm.Command) error {
	for _, c := range a.checks {
		if why, retry := c.check(s, cmd); why != "" {
			// Classified only now: it reads the key's record, which
			// the common case (room everywhere) need not pay for.
			if !addsData(s, cmd) {
				return nil
			}
			a.refused.WithLabelValues(c.name).Inc()
			return &backend.Error{Code: contract.CodeResourceExhausted, RetryAfter: retry,
				Message: why + "; writes that add data resume by themselves once there is room (reads, replays, heartbeats and releases keep working)"}
		}
	}
	return nil
}

// diskSpace samples the free space of a directory's filesystem.
type diskSpace struct {
	dir     string
	free    func(dir string) (free, total uint64, err error)
	reserve uint64 // refuse below this many free bytes

	mu      sync.Mutex
	sampled time.Time
	last    uint64
	lastErr error

	freeGauge prometheus.GaugeFunc
}

// statfsFree is the free space (for unprivileged writers) and size of dir's filesystem.
func statfsFree(dir string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("node: statfs %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// newDiskSpace sets the reserve: reserve bytes, or when 0 the default (5%
// of the filesystem, at most 1 GiB).
func newDiskSpace(dir string, reserve uint64, free func(string) (uint64, uint64, error)) (*diskSpace, error) {
	if free == nil {
		free = statfsFree
	}
	d := &diskSpace{dir: dir, free: free, reserve: reserve}
	if d.reserve == 0 {
		_, total, err := free(dir)
		if err != nil {
			return nil, err
		}
		d.reserve = min(total*defaultDiskReservePercent/100, DefaultMaxDiskReserve)
	}
	d.freeGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_node_disk_free_bytes",
		Help: "Free space of the data dir's filesystem, as admission control last sampled it."}, func() float64 {
		f, _ := d.sample()
		return float64(f)
	})
	return d, nil
}

func (d *diskSpace) sample() (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if time.Since(d.sampled) >= diskSampleEvery {
		d.last, _, d.lastErr = d.free(d.dir)
		d.sampled = time.Now()
	}
	return d.last, d.lastErr
}

// low reports whether the free space is below the reserve (false when it
// cannot be read: a real write failure still fails stop), and the free bytes.
func (d *diskSpace) low() (bool, uint64) {
	free, err := d.sample()
	return err == nil && free < d.reserve, free
}

// check is the admission check: "" while the free space is above the reserve.
func (d *diskSpace) check(*shard, *fsm.Command) (string, time.Duration) {
	if low, free := d.low(); low {
		return fmt.Sprintf("the data dir's disk on this node has %d bytes free, below its reserve of %d", free, d.reserve), admissionRetryAfter
	}
	return "", 0
}
