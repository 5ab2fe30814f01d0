package client_test

import (
	"encoding/hex"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/client"
)

func TestNewKeyIsUUIDv7(t *testing.T) {
	shape := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	before := time.Now().UnixMilli()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = client.NewKey()
	}
	after := time.Now().UnixMilli()
	seen := make(map[string]bool)
	for _, k := range keys {
		if !shape.MatchString(k) {
			t.Fatalf("key %q is not a canonical UUIDv7 (version nibble 7, RFC 9562 variant)", k)
		}
		if seen[k] {
			t.Fatalf("key %q made twice", k)
		}
		seen[k] = true
		b, err := hex.DecodeString(strings.ReplaceAll(k, "-", "")[:12])
		if err != nil {
			t.Fatal(err)
		}
		var ms int64
		for _, x := range b {
			ms = ms<<8 | int64(x)
		}
		if ms < before || ms > after {
			t.Errorf("key %q carries time %d ms, outside [%d, %d]", k, ms, before, after)
		}
	}
	if !slices.IsSorted(keys) {
		t.Error("keys made one after another do not sort in creation order")
	}
}

func TestNewOwnerToken(t *testing.T) {
	shape := regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)
	a, b := client.NewOwnerToken(), client.NewOwnerToken()
	if !shape.MatchString(a) || a == b {
		t.Errorf("tokens %q, %q: want two distinct 22-char base64url tokens", a, b)
	}
}
