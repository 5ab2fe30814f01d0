package httpidem

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/contract"
)

// ParseKey reads the Idempotency-Key field values of a request. present is
// false when there is none. The value is a structured-field string ("k",
// with \" and \\ escapes) or a bare value; either way the key is 1 to 255
// bytes of printable ASCII (0x21-0x7E). Optional whitespace around the value
// is ignored. Several field lines, structured-field parameters and anything
// after the closing quote are errors: a key must be unambiguous.
func ParseKey(values []string) (key string, present bool, err error) {
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, fmt.Errorf("%d %s fields: send exactly one", len(values), HeaderKey)
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", true, fmt.Errorf("%s is empty: send a key of 1 to %d printable ASCII characters", HeaderKey, contract.MaxKeyBytes)
	}
	if v[0] == '"' {
		key, err = parseSFString(v)
		if err != nil {
			return "", true, err
		}
	} else {
		key = v
	}
	if err := ValidateKey(key); err != nil {
		return "", true, err
	}
	return key, true, nil
}

// parseSFString parses an RFC 8941 sf-string that makes up the whole value.
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", fmt.Errorf("%s %q has an invalid escape: only \\\" and \\\\ are allowed in a quoted key", HeaderKey, v)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%s %q has text after the closing quote (parameters are not supported)", HeaderKey, v)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%s has byte 0x%02X inside the quotes: use printable ASCII", HeaderKey, c)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("%s %q has no closing quote", HeaderKey, v)
}

// ValidateKey checks a key against the contract: 1 to 255 bytes of printable
// ASCII (0x21-0x7E).
func ValidateKey(key string) error {
	v := contract.CheckKey(key)
	switch {
	case v == nil:
		return nil
	case v.Fault == contract.FaultEmpty:
		return fmt.Errorf("the idempotency key is empty: use 1 to %d printable ASCII characters", contract.MaxKeyBytes)
	case v.Fault == contract.FaultLength:
		return fmt.Errorf("the idempotency key is %d bytes long: use at most %d", v.Len, contract.MaxKeyBytes)
	}
	return fmt.Errorf("the idempotency key has byte 0x%02X at position %d: use printable ASCII without spaces (0x21-0x7E)", v.Byte, v.Pos)
}

// ValidNamespace reports whether ns matches [a-z0-9][a-z0-9._-]{0,62}.
func ValidNamespace(ns string) bool { return contract.ValidNamespace(ns) }

// CertNamespacePrefix starts every namespace NamespaceFromCert derives from a
// public key; no namespace taken from a common name starts with it.
const CertNamespacePrefix = "spki-"

// NamespaceFromCert is the default namespace of a verified client
// certificate: its Subject common name when that is a valid namespace as it
// stands (lower case, at most 63 characters) and does not start with
// CertNamespacePrefix; otherwise "spki-" followed by the first 40 hex digits
// (160 bits) of the SHA-256 of its SubjectPublicKeyInfo. Readable names for
// well-named service certificates, and a collision-free name for every other
// certificate (it stays the same across renewals that keep the key). Two
// classes never collide, since a common name with the prefix is hashed too.
func NamespaceFromCert(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", errors.New("no client certificate")
	}
	cn := cert.Subject.CommonName
	if ValidNamespace(cn) && !strings.HasPrefix(cn, CertNamespacePrefix) {
		return cn, nil
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return CertNamespacePrefix + hex.EncodeToString(sum[:20]), nil
}
