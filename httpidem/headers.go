package httpidem

import (
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/contract"
)

// neverStored are the response headers that are never stored or replayed:
// hop-by-hop headers (RFC 9110 7.6.1, plus the legacy Keep-Alive and
// Proxy-Connection), cookies (a replay must not hand one caller's session to
// a retry, and Set-Cookie cannot be joined with ", "), Content-Length (a
// replay's framing is recomputed; the body may have been omitted), Date (a
// replay is a new message, which the server dates), and the engine's own
// replay markers (set by the engine alone). A record completed by another
// producer (the JSON API) may hold them: replays leave them out too.
var neverStored = map[string]bool{
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Connection":    true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
	"Set-Cookie":          true,
	"Set-Cookie2":         true,
	"Content-Length":      true,
	"Date":                true,
	HeaderReplayed:        true,
	HeaderBodyOmitted:     true,
	HeaderKeyExpires:      true,
}

// replayedHeaders are the stored headers a replay sends: all but those
// never stored (except HeaderBodyOmitted, which the engine stores itself)
// and those a stored Connection header names.
func replayedHeaders(stored map[string]string) http.Header {
	connection := make(map[string]bool)
	for name, value := range stored {
		if http.CanonicalHeaderKey(name) != "Connection" {
			continue
		}
		for n := range strings.SplitSeq(value, ",") {
			if n = textproto.TrimString(n); n != "" {
				connection[http.CanonicalHeaderKey(n)] = true
			}
		}
	}
	out := make(http.Header, len(stored))
	for name, value := range stored {
		if canon := http.CanonicalHeaderKey(name); canon == HeaderBodyOmitted || !neverStored[canon] && !connection[canon] {
			out[name] = []string{value}
		}
	}
	return out
}

// headerPolicy decides which response headers are stored.
type headerPolicy struct {
	allow map[string]bool // nil: every header not denied
	deny  map[string]bool
}

func newHeaderPolicy(allow, deny []string) headerPolicy {
	p := headerPolicy{deny: make(map[string]bool)}
	if len(allow) > 0 {
		p.allow = make(map[string]bool)
		for _, n := range allow {
			p.allow[http.CanonicalHeaderKey(n)] = true
		}
	}
	for _, n := range deny {
		p.deny[http.CanonicalHeaderKey(n)] = true
	}
	return p
}

// stored returns the headers of h to store: those the handler set or changed
// (not in base with the same values), minus the excluded ones, multiple
// values joined with ", ", within the store's bounds. dropped names the
// headers left out for the bounds.
func (p headerPolicy) stored(h, base http.Header) (out map[string]string, dropped []string) {
	connection := make(map[string]bool)
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				connection[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	names := make([]string, 0, len(h))
	for name, values := range h {
		canon := http.CanonicalHeaderKey(name)
		switch {
		case values == nil, strings.HasPrefix(name, http.TrailerPrefix),
			neverStored[canon], connection[canon], p.deny[canon],
			p.allow != nil && !p.allow[canon],
			slices.Equal(values, base[name]):
			continue
		}
		names = append(names, name)
	}
	slices.Sort(names)
	out = make(map[string]string, len(names))
	total := 0
	for _, name := range names {
		value := strings.Join(h[name], ", ")
		if !storableHeader(name, value) || len(out) >= contract.MaxHeaders-1 || total+len(name)+len(value) > contract.MaxHeadersTotalBytes-len(HeaderBodyOmitted)-4 {
			// One entry and a few bytes stay free for the body-omitted marker.
			dropped = append(dropped, name)
			continue
		}
		out[name] = value
		total += len(name) + len(value)
	}
	return out, dropped
}

// storableHeader reports whether the store accepts the header: a token name
// of at most contract.MaxHeaderNameBytes, a value of at most contract.MaxHeaderValueBytes
// without control characters other than tab.
func storableHeader(name, value string) bool {
	if len(name) > contract.MaxHeaderNameBytes || !validToken(name) || len(value) > contract.MaxHeaderValueBytes {
		return false
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// HeaderPrefer is RFC 7240's request header; "Prefer: wait=N" asks to wait
// up to N seconds for a running request with the same key.
const HeaderPrefer = "Prefer"

// ParsePreferWait returns the wait preference of Prefer header values
// (RFC 7240: comma-separated preferences, each token[=value] with optional
// ";" parameters; names are case-insensitive, the value may be quoted), or
// false when none is given or it is not a non-negative integer. The first
// wait preference counts.
func ParsePreferWait(values []string) (time.Duration, bool) {
	for _, v := range values {
		for _, pref := range strings.Split(v, ",") {
			pref, _, _ = strings.Cut(pref, ";")
			name, val, ok := strings.Cut(strings.TrimSpace(pref), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			val = strings.Trim(strings.TrimSpace(val), `"`)
			secs, err := strconv.ParseUint(val, 10, 32)
			if err != nil {
				return 0, false
			}
			return time.Duration(secs) * time.Second, true
		}
	}
	return 0, false
}

// preferredWait is how long the request may wait for a running request with
// its key: its Prefer: wait, bounded by MaxWait; 0 without one, or when
// MaxWait is negative.
func (e *Engine) preferredWait(r *http.Request) time.Duration {
	if e.cfg.MaxWait < 0 {
		return 0
	}
	d, ok := ParsePreferWait(r.Header.Values(HeaderPrefer))
	if !ok {
		return 0
	}
	return min(d, e.cfg.MaxWait)
}

// StripFencingHeaders removes from h every header that a server or framework
// could read as the fencing token: Idempotency-Fencing-Token in any case, and
// every variant that differs only by '_' for '-' (Idempotency_Fencing_Token:
// CGI, WSGI and several frameworks fold both to one character). Only the
// engine sets the token, after this: a caller can neither forge one nor
// slip a second beside it.
func StripFencingHeaders(h http.Header) {
	for name := range h {
		if isFencingHeaderName(name) {
			delete(h, name)
		}
	}
}

func isFencingHeaderName(name string) bool {
	return len(name) == len(HeaderFencingToken) && strings.EqualFold(strings.ReplaceAll(name, "_", "-"), HeaderFencingToken)
}
