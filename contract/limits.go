package contract

import "time"

// Limits of the public API (docs/api.md). Where the contract names no bound
// (headers, response size), server's doc.go says why these.
const (
	// MaxNamespaceBytes bounds a namespace (and every other name: cluster,
	// region, node).
	MaxNamespaceBytes = 63
	// MaxKeyBytes bounds an idempotency key.
	MaxKeyBytes = 255
	// MaxFingerprintChars bounds a fingerprint, in Unicode code points.
	MaxFingerprintChars = 256

	// MinLeaseMs, MaxLeaseMs and DefaultLeaseMs bound lease_ms; 0 on the
	// wire means the default.
	MinLeaseMs     = 100
	MaxLeaseMs     = 600_000
	DefaultLeaseMs = 30_000
	// MaxWaitMs bounds a reserve's wait_ms (v1.1; docs/api.md,
	// "Waiting for an in-flight key"); 0 does not wait.
	MaxWaitMs = 30_000

	// MinOwnerTokenChars and MaxOwnerTokenChars bound an owner token.
	MinOwnerTokenChars = 16
	MaxOwnerTokenChars = 128

	// MinStatus and MaxStatus bound a stored response's HTTP status.
	MinStatus = 100
	MaxStatus = 599

	// MinRetentionS, MaxRetentionS (30 days) and DefaultRetentionS bound
	// retention_s; 0 on the wire means the default.
	MinRetentionS     = 1
	MaxRetentionS     = 2_592_000
	DefaultRetentionS = 86_400

	// Bounds of a stored response's headers.
	MaxHeaders           = 100
	MaxHeaderNameBytes   = 256
	MaxHeaderValueBytes  = 8 << 10
	MaxHeadersTotalBytes = 64 << 10

	// MaxRequestHeaderBytes bounds the headers of one request to an idem
	// listener: a gRPC request's metadata (advertised as HTTP/2's
	// SETTINGS_MAX_HEADER_LIST_SIZE and enforced while decoding, so that
	// HPACK-compressed repeats cannot inflate into memory) and an HTTP
	// request's header block.
	MaxRequestHeaderBytes = 64 << 10

	// DefaultMaxResponseBytes is the default largest stored response body
	// (--max-response-bytes).
	DefaultMaxResponseBytes = 1 << 20
	// MaxMaxResponseBytes is the ceiling of --max-response-bytes: a stored
	// response travels in one Raft entry and one gRPC message.
	MaxMaxResponseBytes = 256 << 20
)

// The lease and retention bounds as durations, for APIs that take a
// time.Duration (the Go client, the HTTP engine).
const (
	MinLease         = MinLeaseMs * time.Millisecond
	MaxLease         = MaxLeaseMs * time.Millisecond
	DefaultLease     = DefaultLeaseMs * time.Millisecond
	MinRetention     = MinRetentionS * time.Second
	MaxRetention     = MaxRetentionS * time.Second
	DefaultRetention = DefaultRetentionS * time.Second
	MaxWait          = MaxWaitMs * time.Millisecond
)

// GRPCMaxMessageBytes is the largest gRPC message a service storing bodies of
// up to maxResponseBytes accepts, and what a gRPC client of it (a router, a
// forwarding node) should allow for requests and replies: a max-size body
// plus headers and other fields, and never below gRPC's default of 4 MiB.
// maxResponseBytes 0 means DefaultMaxResponseBytes.
func GRPCMaxMessageBytes(maxResponseBytes int64) int {
	if maxResponseBytes == 0 {
		maxResponseBytes = DefaultMaxResponseBytes
	}
	return int(max(maxResponseBytes+1<<20, 4<<20))
}
