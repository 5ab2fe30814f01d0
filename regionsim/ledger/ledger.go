package ledger

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Errors of package ledger.
var (
	// ErrFenced: the write or read carried a fencing token lower than the
	// highest the ledger has seen for the key; a newer owner took over.
	ErrFenced = errors.New("ledger: stale fencing token")
)

// Charge is one charge write the ledger received.
type Charge struct {
	Key      string
	Token    uint64 // the writer's fencing token (0 when it has none)
	Amount   int64
	ID       string // the charge id, unique per accepted charge
	By       string // which worker wrote it
	At       time.Time
	Accepted bool
}

// Ledger records charges. It is safe for concurrent use.
type Ledger struct {
	name  string
	guard bool

	mu       sync.Mutex
	seq      int
	highest  map[string]uint64
	accepted map[string][]Charge
	rejected int
}

// New returns an empty ledger; guard turns the fencing guard on.
func New(name string, guard bool) *Ledger {
	return &Ledger{name: name, guard: guard, highest: map[string]uint64{}, accepted: map[string][]Charge{}}
}

// Name returns the ledger's name.
func (l *Ledger) Name() string { return l.name }

// Guarded reports whether the fencing guard is on.
func (l *Ledger) Guarded() bool { return l.guard }

// fence raises the key's highest token, or refuses a stale one.
func (l *Ledger) fence(key string, token uint64) error {
	if !l.guard {
		return nil
	}
	if token < l.highest[key] {
		return fmt.Errorf("%w: key %s, token %d < %d", ErrFenced, key, token, l.highest[key])
	}
	l.highest[key] = token
	return nil
}

// Charge records a charge of amount for key by a writer holding fencing
// token token. With the guard on, a token below the highest seen for key is
// refused with ErrFenced and nothing is charged.
func (l *Ledger) Charge(key string, token uint64, amount int64, by string) (Charge, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := Charge{Key: key, Token: token, Amount: amount, By: by, At: time.Now()}
	if err := l.fence(key, token); err != nil {
		l.rejected++
		return c, err
	}
	l.seq++
	c.ID = fmt.Sprintf("ch_%s_%06d", l.name, l.seq)
	c.Accepted = true
	l.accepted[key] = append(l.accepted[key], c)
	return c, nil
}

// Lookup returns the charges already made for key, for a new owner that
// must find out what an earlier attempt did. It is a fenced read: with the
// guard on it raises the key's highest token to token (so an older owner's
// late write is refused from now on) or fails with ErrFenced.
func (l *Ledger) Lookup(key string, token uint64) ([]Charge, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.fence(key, token); err != nil {
		l.rejected++
		return nil, err
	}
	return append([]Charge(nil), l.accepted[key]...), nil
}

// Charges returns the accepted charges of key.
func (l *Ledger) Charges(key string) []Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Charge(nil), l.accepted[key]...)
}

// All returns every accepted charge by key.
func (l *Ledger) All() map[string][]Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string][]Charge, len(l.accepted))
	for k, cs := range l.accepted {
		out[k] = append([]Charge(nil), cs...)
	}
	return out
}

// Stats counts accepted charges, keys charged, keys charged more than once
// and refused writes.
type Stats struct {
	Accepted, Keys, DoubleCharged, Rejected int
}

// Stats returns the ledger's counters.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Stats{Keys: len(l.accepted), Rejected: l.rejected}
	for _, cs := range l.accepted {
		s.Accepted += len(cs)
		if len(cs) > 1 {
			s.DoubleCharged++
		}
	}
	return s
}

// DoubleCharged returns the keys charged more than once, sorted.
func (l *Ledger) DoubleCharged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k, cs := range l.accepted {
		if len(cs) > 1 {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
