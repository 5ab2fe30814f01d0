package topology

import (
	"errors"
	"strings"
)

// Sentinel errors of package topology. Test for them with errors.Is.
var (
	// ErrInvalidTopology is wrapped by every error that Parse, LoadFile,
	// Validate and NewRing return for a topology that cannot be read or
	// that breaks a rule: fix the file and restart.
	ErrInvalidTopology = errors.New("topology: invalid topology")

	// ErrRing is wrapped when the consistent-hash library refuses the ring
	// parameters of an otherwise valid topology (it should not happen for
	// parameters that pass Validate; the message carries the library's
	// complaint).
	ErrRing = errors.New("topology: cannot build ring")

	// ErrFingerprintMismatch is returned by NewRingFromShards when the ring
	// it rebuilt has another fingerprint than the one the node reported: a
	// ring that cannot be trusted to place keys as the nodes do.
	ErrFingerprintMismatch = errors.New("topology: rebuilt ring has another fingerprint")
)

// FieldError is one problem found by Validate, located by a field path in the
// topology file such as "regions[1].nodes[0].id".
type FieldError struct {
	// Path names the offending field, with list indexes as in the file.
	Path string
	// Message says what is wrong and, where it helps, what to do.
	Message string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Message }

// Unwrap makes errors.Is(err, ErrInvalidTopology) hold for a single problem.
func (e *FieldError) Unwrap() error { return ErrInvalidTopology }

// ValidationError carries every problem Validate found. Like
// errors.Join it unwraps to each problem (so errors.As finds a *FieldError),
// and also to ErrInvalidTopology; unlike errors.Join its message is one line,
// as a command line tool wants to print it.
type ValidationError struct {
	// Source names the file the topology came from ("" when parsed from
	// bytes).
	Source string
	// Problems lists every problem, never empty.
	Problems []*FieldError
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString(ErrInvalidTopology.Error())
	if e.Source != "" {
		b.WriteString(" " + e.Source)
	}
	for i, p := range e.Problems {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(p.Error())
	}
	return b.String()
}

// Unwrap returns ErrInvalidTopology followed by every problem.
func (e *ValidationError) Unwrap() []error {
	errs := make([]error, 0, len(e.Problems)+1)
	errs = append(errs, ErrInvalidTopology)
	for _, p := range e.Problems {
		errs = append(errs, p)
	}
	return errs
}

// Problems returns every *FieldError inside err (walking wrapped and joined
// errors), or nil when there is none.
func Problems(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if fe, ok := e.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}
