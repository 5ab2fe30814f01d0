package httpidem

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/textproto"
	"strings"
	"time"
)

// captureWriter is the ResponseWriter a handler (or the upstream forwarder)
// writes a keyed response to. It records the status, the headers as they
// were when the status was written, and the body up to the store's limit,
// and it holds the response back from the caller until the engine stored (or
// released) it, so that a caller who has seen the answer finds it stored when
// it retries. Two things start the response early, from which point it
// streams: a body that outgrows the limit (it will not be stored in full
// anyway), and a Flush of a text/event-stream response. Other Flush calls
// are deferred to the end.
//
// Writes to a caller that went away are swallowed: the handler keeps going,
// and its response is stored for the retry.
//
// Like any ResponseWriter it is not safe for concurrent use.
type captureWriter struct {
	rw    http.ResponseWriter
	base  http.Header // rw's headers before the handler ran (set by outer middleware)
	hdr   http.Header // the handler's header map
	limit int64       // largest body that is stored

	status    int         // final status; 0 until written
	sent      http.Header // hdr when the status was written
	finalized bool        // sent holds its final value (Content-Type sniffed)
	buf       bytes.Buffer
	total     int64 // body bytes written by the handler
	overflow  bool  // the body outgrew limit: it is not stored
	committed bool  // the status and headers went to rw
	clientErr error // first failed write to the caller
}

func newCaptureWriter(rw http.ResponseWriter, limit int64) *captureWriter {
	base := rw.Header().Clone()
	if base == nil {
		base = make(http.Header)
	}
	return &captureWriter{rw: rw, base: base, hdr: base.Clone(), limit: limit}
}

func (c *captureWriter) Header() http.Header { return c.hdr }

func (c *captureWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if c.status != 0 {
		return // superfluous, as net/http ignores it
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		c.informational(code)
		return
	}
	c.status = code
	c.sent = c.hdr.Clone()
}

// informational passes a 1xx response (103 Early Hints, say) straight
// through; it is neither held nor stored.
func (c *captureWriter) informational(code int) {
	h := c.rw.Header()
	saved := h.Clone()
	for k, v := range c.hdr {
		h[k] = v
	}
	c.rw.WriteHeader(code)
	clear(h)
	for k, v := range saved {
		h[k] = v
	}
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	c.total += int64(len(p))
	if !c.overflow {
		if int64(c.buf.Len())+int64(len(p)) <= c.limit {
			c.buf.Write(p)
			if c.committed {
				c.send(p)
			}
			return len(p), nil
		}
		c.overflow = true
		if !c.committed {
			c.commit(p)
		}
		c.buf = bytes.Buffer{} // the body will not be stored: let it go
	}
	c.send(p)
	return len(p), nil
}

// Flush sends what was written so far, but only once the response streams
// (see the type's comment); before, it is deferred to the end.
func (c *captureWriter) Flush() {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !c.committed {
		mediaType, _, _ := mime.ParseMediaType(c.sent.Get("Content-Type"))
		if mediaType != "text/event-stream" {
			return
		}
		c.commit(nil)
	}
	if c.clientErr == nil {
		if err := http.NewResponseController(c.rw).Flush(); err != nil {
			c.clientErr = err
		}
	}
}

// FlushError is Flush for http.ResponseController; a caller that went away
// is not the handler's concern, so it never fails.
func (c *captureWriter) FlushError() error {
	c.Flush()
	return nil
}

// ReadFrom copies src through Write, so that io.Copy to the writer is
// captured like any other write.
func (c *captureWriter) ReadFrom(src io.Reader) (int64, error) {
	return io.Copy(writerOnly{c}, src)
}

type writerOnly struct{ io.Writer }

// SetReadDeadline, SetWriteDeadline and EnableFullDuplex serve
// http.ResponseController. The writer does not offer Hijack: a keyed
// response must go through it to be stored.
func (c *captureWriter) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(c.rw).SetReadDeadline(t)
}

func (c *captureWriter) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(c.rw).SetWriteDeadline(t)
}

func (c *captureWriter) EnableFullDuplex() error {
	return http.NewResponseController(c.rw).EnableFullDuplex()
}

// finalize fixes the status (200 when the handler wrote nothing) and the
// headers, sniffing a Content-Type from the first bytes the way net/http
// would, so that the caller and every replay get the same one.
func (c *captureWriter) finalize(pending []byte) {
	if c.finalized {
		return
	}
	c.finalized = true
	if c.status == 0 {
		c.status = http.StatusOK
		c.sent = c.hdr.Clone()
	}
	if _, has := c.sent["Content-Type"]; has || !bodyAllowed(c.status) {
		return
	}
	data := c.buf.Bytes()
	if len(data) == 0 {
		data = pending
	}
	if len(data) > 0 {
		c.sent.Set("Content-Type", http.DetectContentType(data))
	}
}

// commit sends the status, the headers and the held body to the caller.
func (c *captureWriter) commit(pending []byte) {
	c.finalize(pending)
	c.committed = true
	h := c.rw.Header()
	for k := range c.base {
		if _, kept := c.sent[k]; !kept {
			delete(h, k)
		}
	}
	for k, v := range c.sent {
		h[k] = v
	}
	c.rw.WriteHeader(c.status)
	if c.buf.Len() > 0 {
		c.send(c.buf.Bytes())
	}
}

// deliver sends whatever is still held, and the trailers.
func (c *captureWriter) deliver() {
	if !c.committed {
		c.commit(nil)
	}
	declared := make(map[string]bool)
	for _, v := range c.sent["Trailer"] {
		for name := range strings.SplitSeq(v, ",") {
			declared[http.CanonicalHeaderKey(textproto.TrimString(name))] = true
		}
	}
	h := c.rw.Header()
	for k, v := range c.hdr {
		if strings.HasPrefix(k, http.TrailerPrefix) || declared[http.CanonicalHeaderKey(k)] {
			h[k] = v
		}
	}
}

func (c *captureWriter) send(p []byte) {
	if c.clientErr != nil {
		return
	}
	if _, err := c.rw.Write(p); err != nil {
		c.clientErr = err
	}
}

// reset forgets everything written, if nothing reached the caller yet.
func (c *captureWriter) reset() bool {
	if c.committed {
		return false
	}
	*c = captureWriter{rw: c.rw, base: c.base, hdr: c.base.Clone(), limit: c.limit}
	return true
}

// ResetResponse discards what a handler wrote to w so far, so that it can
// write another response instead (the proxy answers 504 when the upstream's
// body stalls past the deadline). It reports false, changing nothing, when
// w is not the engine's writer or the response already reached the caller.
func ResetResponse(w http.ResponseWriter) bool {
	c, ok := w.(*captureWriter)
	return ok && c.reset()
}

// bodyAllowed reports whether a response with status may have a body
// (RFC 9110: not 1xx, 204, 304).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
