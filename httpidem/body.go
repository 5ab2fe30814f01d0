package httpidem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
)

// Failures of readBody: the body is larger than MaxRequestBytes, or it could
// not be spooled (the server's fault, not the caller's).
var (
	errBodyTooLarge = errors.New("request body too large")
	errSpool        = errors.New("httpidem: spool request body")
)

// body is a keyed request's body, read in full before the reservation (the
// fingerprint covers it) so that it can be handed to the handler or sent
// upstream afterwards: in memory up to the spool threshold, in a temporary
// file (already unlinked) beyond it.
type body struct {
	mem  []byte
	file *os.File
	size int64
}

// readBody reads r to the end into a body, writing every byte to h as well.
// It fails with errBodyTooLarge past limit bytes.
func readBody(r io.Reader, limit, spoolAt int64, dir string, h hash.Hash) (*body, error) {
	b := &body{}
	var mem bytes.Buffer
	var dst io.Writer = &mem
	buf := make([]byte, 32<<10)
	src := io.LimitReader(r, limit+1)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			b.size += int64(n)
			if b.size > limit {
				b.close()
				return nil, errBodyTooLarge
			}
			h.Write(buf[:n])
			if b.file == nil && b.size > spoolAt {
				f, ferr := spoolFile(dir)
				if ferr != nil {
					return nil, ferr
				}
				b.file = f
				if _, werr := f.Write(mem.Bytes()); werr != nil {
					b.close()
					return nil, fmt.Errorf("%w: %w", errSpool, werr)
				}
				mem = bytes.Buffer{}
				dst = f
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				b.close()
				return nil, fmt.Errorf("%w: %w", errSpool, werr)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			b.close()
			return nil, err
		}
	}
	if b.file == nil {
		b.mem = mem.Bytes()
	}
	return b, nil
}

// spoolFile creates a temporary file and unlinks it at once, so that it
// disappears with its last descriptor even if the process crashes.
func spoolFile(dir string) (*os.File, error) {
	f, err := os.CreateTemp(dir, "idem-body-*")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSpool, err)
	}
	_ = os.Remove(f.Name())
	return f, nil
}

// reader returns a fresh reader over the whole body.
func (b *body) reader() io.ReadCloser {
	if b.file != nil {
		return io.NopCloser(io.NewSectionReader(b.file, 0, b.size))
	}
	return io.NopCloser(bytes.NewReader(b.mem))
}

// close releases the spool file, if any.
func (b *body) close() {
	if b.file != nil {
		_ = b.file.Close()
	}
}

// fingerprintVersion starts every fingerprint's input; change it when the
// input changes, so that an old fingerprint never equals a new one by chance.
const fingerprintVersion = "idem-http-fingerprint-v1"

// newFingerprintHash starts the fingerprint of r: SHA-256 over the method,
// the escaped path, the raw query and the named headers (values joined with
// ", "), each length-prefixed so that no two requests give the same input;
// the body follows, unprefixed, as it is read.
func newFingerprintHash(r *http.Request, headers []string) hash.Hash {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(fingerprintVersion)
	field(r.Method)
	field(r.URL.EscapedPath())
	field(r.URL.RawQuery)
	for _, name := range headers {
		field(name)
		field(strings.Join(r.Header.Values(name), ", "))
	}
	return h
}

// fingerprintOf finishes the hash: "sha256:" and 64 hex digits.
func fingerprintOf(h hash.Hash) string {
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// canonicalHeaders returns names in canonical form, sorted and deduplicated.
func canonicalHeaders(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, http.CanonicalHeaderKey(n))
	}
	slices.Sort(out)
	return slices.Compact(out)
}
