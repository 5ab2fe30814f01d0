// Package keyspace is the one function every idem process must agree on to
// place a key: its ring partition. topology.Ring maps partitions to shards;
// the state machine (package fsm) checks each command's partition against
// what its group serves. It is a leaf, so both can import it.
package keyspace

import "github.com/cespare/xxhash/v2"

// bufSize covers a maximal namespace (63 bytes), the separator and a
// maximal key (255 bytes), so valid names are hashed without allocating.
const bufSize = 320

// Partition is the ring partition of (namespace, key) among count
// partitions: xxHash64(namespace + "\x00" + key) mod count (the NUL keeps
// "ab"+"c" apart from "a"+"bc"), exactly as the consistent-hashing library
// idem builds its ring with computes it for those bytes.
func Partition(namespace, key string, count uint32) uint32 {
	n := len(namespace) + 1 + len(key)
	var h uint64
	if n <= bufSize {
		var buf [bufSize]byte
		copy(buf[:], namespace)
		buf[len(namespace)] = 0
		copy(buf[len(namespace)+1:], key)
		h = xxhash.Sum64(buf[:n])
	} else {
		d := xxhash.New()
		_, _ = d.WriteString(namespace)
		_, _ = d.Write([]byte{0})
		_, _ = d.WriteString(key)
		h = d.Sum64()
	}
	return uint32(h % uint64(count))
}
