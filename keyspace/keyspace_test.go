package keyspace

import (
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// Short names take the stack path, long ones the streaming one: both hash
// namespace, NUL, key.
func TestPartition(t *testing.T) {
	long := strings.Repeat("k", 400)
	for _, c := range []struct{ ns, key string }{{"payments", "order-7"}, {"a", "bc"}, {"ab", "c"}, {"ns", long}} {
		want := uint32(xxhash.Sum64String(c.ns+"\x00"+c.key) % 16411)
		if got := Partition(c.ns, c.key, 16411); got != want {
			t.Errorf("Partition(%q, %q) = %d, want %d", c.ns, c.key[:min(len(c.key), 10)], got, want)
		}
	}
	if Partition("a", "bc", 1<<20) == Partition("ab", "c", 1<<20) {
		t.Error(`"a"+"bc" and "ab"+"c" share a partition: the separator is missing`)
	}
}

func BenchmarkPartition(b *testing.B) {
	for b.Loop() {
		Partition("payments", "order-1234567", 16411)
	}
}
