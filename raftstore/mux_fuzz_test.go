package raftstore

import (
	"bytes"
	"testing"
)

// FuzzReadMuxHeader feeds arbitrary bytes to the Raft port's header reader,
// as any peer that passed the handshake (or any peer at all, in insecure
// mode) can: it must never panic, never read past the header, and accept
// only a valid shard id whose encoding is exactly the bytes it consumed.
func FuzzReadMuxHeader(f *testing.F) {
	f.Add(encodeMuxHeader("us-east-0"))
	f.Add(append(encodeMuxHeader("s0"), "raft bytes"...))
	f.Add([]byte("IDRM\x01\x00"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		id, err := readMuxHeader(r)
		if err != nil {
			return
		}
		if !validShardID(id) {
			t.Fatalf("accepted invalid shard id %q", id)
		}
		consumed := len(data) - r.Len()
		if h := encodeMuxHeader(id); !bytes.Equal(h, data[:consumed]) {
			t.Fatalf("consumed %q, but the header of %q is %q", data[:consumed], id, h)
		}
	})
}
