package client

import (
	"github.com/google/uuid"

	"github.com/idem-dev/idem/contract"
)

// NewKey returns a fresh idempotency key: a UUIDv7 in its canonical
// 36-character form. UUIDv7 starts with the Unix time in milliseconds, so keys
// sort by creation time (and stay unique within a millisecond: the rest is a
// counter and random bits). Make the key once per logical operation and send
// it along with every retry of that operation.
func NewKey() string {
	return uuid.Must(uuid.NewV7()).String()
}

// NewOwnerToken returns a fresh owner token: 128 random bits, base64url
// without padding (22 characters). Reserve calls it when the caller gave no
// token.
func NewOwnerToken() string { return contract.NewOwnerToken() }
