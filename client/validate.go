package client

import (
	"errors"
	"fmt"
	"time"
)

// Limits of the public contract (API-v1.md), checked before a request is sent
// so that a bad argument fails at once, without a round trip or retries.
const (
	MinLease          = 100 * time.Millisecond
	MaxLease          = 10 * time.Minute
	MinRetention      = time.Second
	MaxRetention      = 30 * 24 * time.Hour
	MaxFingerprintLen = 256
	MaxKeyLen         = 255
	MinOwnerTokenLen  = 16
	MaxOwnerTokenLen  = 128
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

func validateNames(namespace, key string) error {
	var errs []error
	if !validNamespace(namespace) {
		errs = append(errs, invalid("namespace %q must match [a-z0-9][a-z0-9._-]{0,62}", namespace))
	}
	if !validKey(key) {
		errs = append(errs, invalid("key %q must be 1 to %d bytes of printable ASCII (0x21-0x7E)", key, MaxKeyLen))
	}
	return errors.Join(errs...)
}

func validNamespace(ns string) bool {
	if len(ns) < 1 || len(ns) > 63 {
		return false
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		alnum := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
		if !alnum && (i == 0 || (c != '.' && c != '_' && c != '-')) {
			return false
		}
	}
	return true
}

func validKey(key string) bool {
	if len(key) < 1 || len(key) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

func validOwnerToken(tok string) bool {
	if len(tok) < MinOwnerTokenLen || len(tok) > MaxOwnerTokenLen {
		return false
	}
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func validateOwnerToken(tok string) error {
	if !validOwnerToken(tok) {
		return invalid("owner token must be %d-%d chars of [A-Za-z0-9_-], got %d chars", MinOwnerTokenLen, MaxOwnerTokenLen, len(tok))
	}
	return nil
}

// leaseMillis checks a lease and converts it to the wire's milliseconds (0
// keeps the store's default).
func leaseMillis(lease time.Duration) (int64, error) {
	if lease == 0 {
		return 0, nil
	}
	if lease < MinLease || lease > MaxLease {
		return 0, invalid("lease %v must be between %v and %v (or 0 for the default)", lease, MinLease, MaxLease)
	}
	return lease.Milliseconds(), nil
}

// retentionSeconds checks a retention and converts it to the wire's seconds
// (0 keeps the store's default).
func retentionSeconds(retention time.Duration) (int64, error) {
	if retention == 0 {
		return 0, nil
	}
	if retention < MinRetention || retention > MaxRetention {
		return 0, invalid("retention %v must be between %v and %v (or 0 for the default)", retention, MinRetention, MaxRetention)
	}
	return int64(retention / time.Second), nil
}

func validateResponse(r Response) error {
	if r.Status < 100 || r.Status > 599 {
		return invalid("response status %d must be between 100 and 599", r.Status)
	}
	return nil
}
