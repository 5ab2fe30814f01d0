package pki

import "errors"

// Errors of package pki.
var (
	// ErrExists: a file that would be written already exists; pki never
	// overwrites a CA, a node certificate or a client certificate. Move the
	// old files away first.
	ErrExists = errors.New("pki: file already exists")
	// ErrNotIdem: a certificate carries no idem identity (no idem:// URI SAN,
	// or more than one), or its identity contradicts its key usage.
	ErrNotIdem = errors.New("pki: not an idem certificate")
	// ErrNotNode: a verified certificate is an idem certificate but not a
	// node certificate (a client certificate where a node's was required).
	ErrNotNode = errors.New("pki: not a node certificate")
	// ErrInvalid: a name, host or option given to an issuing function is
	// malformed.
	ErrInvalid = errors.New("pki: invalid argument")
	// ErrNoCA: the CA certificate or key could not be found or does not
	// match (the key belongs to none of the certificates in ca.crt).
	ErrNoCA = errors.New("pki: no usable CA")
)
