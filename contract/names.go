package contract

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
)

// NameGrammar is the grammar of namespaces and of cluster, region and node
// names.
const NameGrammar = `[a-z0-9][a-z0-9._-]{0,62}`

// The rules in words, for messages.
const (
	NamespaceRule  = "use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
	KeyRule        = "a key is 1-255 bytes of printable ASCII (0x21-0x7E)"
	OwnerTokenRule = "an owner token is 16-128 characters of A-Z, a-z, 0-9, '_' and '-'"
)

// Fault is which part of a rule a value broke.
type Fault int

// The faults a check reports.
const (
	// FaultEmpty: the value is empty.
	FaultEmpty Fault = iota + 1
	// FaultLength: the value is too short or too long (Violation.Len).
	FaultLength
	// FaultByte: the byte at Violation.Pos is not allowed there.
	FaultByte
)

// Violation says how a value breaks its rule. Callers word their own
// message from it; Error is a plain default.
type Violation struct {
	// Field is "namespace", "name", "key" or "owner_token".
	Field string
	Fault Fault
	// Len is the value's length in bytes (FaultLength).
	Len int
	// Pos and Byte locate the offending byte (FaultByte).
	Pos  int
	Byte byte
	// Rule is the rule in words (NamespaceRule, KeyRule, OwnerTokenRule).
	Rule string
}

func (v *Violation) Error() string {
	switch v.Fault {
	case FaultEmpty:
		return fmt.Sprintf("contract: %s is empty: %s", v.Field, v.Rule)
	case FaultLength:
		return fmt.Sprintf("contract: %s is %d bytes long: %s", v.Field, v.Len, v.Rule)
	}
	return fmt.Sprintf("contract: %s has %s at position %d: %s", v.Field, DescribeByte(v.Byte), v.Pos, v.Rule)
}

// DescribeByte names c for a message: 'c' when printable, byte 0xNN
// otherwise.
func DescribeByte(c byte) string {
	if c >= 0x21 && c <= 0x7e {
		return fmt.Sprintf("'%c'", c)
	}
	return fmt.Sprintf("byte 0x%02X", c)
}

// check is every rule's shape: a length of minLen..maxLen bytes, each byte
// allowed by ok (given its position).
func check(field, rule, s string, minLen, maxLen int, ok func(i int, c byte) bool) *Violation {
	// The Violation is built only for a name that breaks the rule: a valid
	// one (every request's namespace and key) allocates nothing.
	fault := func(f Fault) *Violation { return &Violation{Field: field, Rule: rule, Len: len(s), Fault: f} }
	switch {
	case s == "":
		return fault(FaultEmpty)
	case len(s) < minLen || len(s) > maxLen:
		return fault(FaultLength)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !ok(i, c) {
			v := fault(FaultByte)
			v.Pos, v.Byte = i, c
			return v
		}
	}
	return nil
}

func lowerOrDigit(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// CheckName checks s against NameGrammar, the grammar of namespaces and of
// cluster, region and node names. field names it in the Violation.
func CheckName(field, s string) *Violation {
	return check(field, NamespaceRule, s, 1, MaxNamespaceBytes, func(i int, c byte) bool {
		return lowerOrDigit(c) || i > 0 && (c == '.' || c == '_' || c == '-')
	})
}

// CheckNamespace checks a namespace against NameGrammar.
func CheckNamespace(ns string) *Violation { return CheckName("namespace", ns) }

// ValidName reports whether s matches NameGrammar.
func ValidName(s string) bool { return CheckName("name", s) == nil }

// ValidNamespace reports whether ns matches NameGrammar.
func ValidNamespace(ns string) bool { return ValidName(ns) }

// CheckKey checks a (decoded) key: 1 to MaxKeyBytes bytes of printable ASCII
// (0x21-0x7E).
func CheckKey(key string) *Violation {
	return check("key", KeyRule, key, 1, MaxKeyBytes, func(_ int, c byte) bool { return c >= 0x21 && c <= 0x7e })
}

// ValidKey reports whether key passes CheckKey.
func ValidKey(key string) bool { return CheckKey(key) == nil }

// CheckOwnerToken checks an owner token: MinOwnerTokenChars to
// MaxOwnerTokenChars characters of [A-Za-z0-9_-]. An empty token is
// FaultEmpty; whether one is allowed is the caller's rule (reserve may omit
// it).
func CheckOwnerToken(tok string) *Violation {
	return check("owner_token", OwnerTokenRule, tok, MinOwnerTokenChars, MaxOwnerTokenChars, func(_ int, c byte) bool {
		return lowerOrDigit(c) || c >= 'A' && c <= 'Z' || c == '_' || c == '-'
	})
}

// ValidOwnerToken reports whether tok passes CheckOwnerToken.
func ValidOwnerToken(tok string) bool { return CheckOwnerToken(tok) == nil }

// NewOwnerToken returns a fresh owner token: 128 random bits, base64url
// without padding (22 characters), within OwnerTokenRule. It is the one
// generator: the server uses it when a reserve names no token, the clients
// and the HTTP engine before they send one.
func NewOwnerToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
