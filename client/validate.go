package client

import (
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/contract"
)

// Limits of the public contract (docs/api.md), checked before a request is sent
// so that a bad argument fails at once, without a round trip or retries.
// Their one home is package contract; these are its values under the
// client's names.
const (
	MinLease          = contract.MinLease
	MaxLease          = contract.MaxLease
	MinRetention      = contract.MinRetention
	MaxRetention      = contract.MaxRetention
	MaxFingerprintLen = contract.MaxFingerprintChars
	MaxKeyLen         = contract.MaxKeyBytes
	MinOwnerTokenLen  = contract.MinOwnerTokenChars
	MaxOwnerTokenLen  = contract.MaxOwnerTokenChars
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

func validateNames(namespace, key string) error {
	var errs []error
	if !contract.ValidNamespace(namespace) {
		errs = append(errs, invalid("namespace %q must match %s", namespace, contract.NameGrammar))
	}
	if !contract.ValidKey(key) {
		errs = append(errs, invalid("key %q must be 1 to %d bytes of printable ASCII (0x21-0x7E)", key, MaxKeyLen))
	}
	return errors.Join(errs...)
}

func validateOwnerToken(tok string) error {
	if !contract.ValidOwnerToken(tok) {
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
	if r.Status < contract.MinStatus || r.Status > contract.MaxStatus {
		return invalid("response status %d must be between %d and %d", r.Status, contract.MinStatus, contract.MaxStatus)
	}
	return nil
}
