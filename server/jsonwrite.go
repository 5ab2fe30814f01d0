package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
)

// The hot answers of the JSON API (a reserve's, a complete's, a
// heartbeat's) are appended by hand into a pooled buffer instead of going
// through encoding/json's reflection: the same bytes, field for field, as
// writeJSON writes for the same structs (the tests compare both), without
// the encoder's allocations.

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// writeAppended writes the JSON body that fill appends, with status.
func writeAppended(w http.ResponseWriter, status int, fill func([]byte) []byte) {
	bp := bodyPool.Get().(*[]byte)
	body := fill((*bp)[:0])
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
	if cap(body) <= 64<<10 { // a replay of a large response is not kept
		*bp = body
		bodyPool.Put(bp)
	}
}

// appendReserveJSON appends out as encoding/json encodes it (with
// SetEscapeHTML(false)), newline included.
func appendReserveJSON(b []byte, out *reserveResponseJSON) []byte {
	b = append(b, `{"outcome":`...)
	b = appendJSONString(b, out.Outcome)
	b = appendOptString(b, `,"owner_token":`, out.OwnerToken)
	b = appendOptString(b, `,"fencing_token":`, out.FencingToken)
	b = appendOptString(b, `,"previous_fencing_token":`, out.PreviousFencingToken)
	b = appendOptString(b, `,"lease_expires_at":`, out.LeaseExpiresAt)
	if out.RetryAfterMs != nil {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, *out.RetryAfterMs, 10)
	}
	if r := out.Response; r != nil {
		b = append(b, `,"response":{"status":`...)
		b = strconv.AppendInt(b, int64(r.Status), 10)
		b = append(b, `,"headers":`...)
		b = appendStringMap(b, r.Headers)
		b = append(b, `,"body":`...)
		b = appendJSONString(b, r.Body)
		b = append(b, '}')
	}
	b = appendOptString(b, `,"completed_at":`, out.CompletedAt)
	b = appendOptString(b, `,"expires_at":`, out.ExpiresAt)
	b = appendOptString(b, `,"expired_at":`, out.ExpiredAt)
	if c := out.Checkpoint; c != nil {
		b = append(b, `,"checkpoint":{"name":`...)
		b = appendJSONString(b, c.Name)
		b = append(b, `,"data":`...)
		b = appendJSONString(b, c.Data)
		b = append(b, `,"fencing_token":`...)
		b = appendJSONString(b, c.FencingToken)
		b = append(b, `,"checkpointed_at":`...)
		b = appendJSONString(b, c.CheckpointedAt)
		b = append(b, '}')
	}
	return append(b, '}', '\n')
}

// appendCompleteJSON appends a complete's answer as encoding/json encodes
// completeJSON.
func appendCompleteJSON(b []byte, out completeJSON) []byte {
	b = append(b, `{"completed_at":`...)
	b = appendJSONString(b, out.CompletedAt)
	b = append(b, `,"expires_at":`...)
	b = appendJSONString(b, out.ExpiresAt)
	return append(b, '}', '\n')
}

// appendHeartbeatJSON appends a heartbeat's answer as encoding/json
// encodes heartbeatJSON.
func appendHeartbeatJSON(b []byte, out heartbeatJSON) []byte {
	b = append(b, `{"lease_expires_at":`...)
	b = appendJSONString(b, out.LeaseExpiresAt)
	return append(b, '}', '\n')
}

// appendOptString appends name and s unless s is empty (omitempty).
func appendOptString(b []byte, name, s string) []byte {
	if s == "" {
		return b
	}
	return appendJSONString(append(b, name...), s)
}

// appendStringMap appends m as encoding/json does: null when nil, keys
// sorted.
func appendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = appendJSONString(b, m[k])
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string literal. Printable ASCII
// without '"' and '\' (tokens, times, base64) is copied; anything else is
// left to encoding/json, whose escapes (control characters, invalid UTF-8,
// U+2028 and U+2029) it keeps exactly.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(s) // a string always encodes
			return append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
