package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Request bodies are decoded in two steps: first into the object's members
// (the fast path, scanObject, takes most bodies in one pass without a map;
// the rest go through a map of raw values from encoding/json), so that
// field names are matched exactly (encoding/json would also accept
// "Lease_MS") and every unknown field, top level or nested, is named in the
// error; then field by field, so that each type error names its field.
//
// A body is refused (400 INVALID_ARGUMENT) rather than rewritten when it is
// not valid UTF-8, when a string escapes half of a UTF-16 surrogate pair
// (encoding/json would store either as U+FFFD, so that two different
// fingerprints would compare equal), or when an object names a member twice
// (encoding/json would keep the last silently).

// The fields each request body may hold.
var (
	reserveFields    = []string{"fingerprint", "if_expired", "lease_ms", "owner_token", "wait_ms"}
	checkpointFields = []string{"data", "name", "owner_token"}
	policyFields     = []string{"default_lease_ms", "default_retention_s", "max_lease_ms", "max_retention_s", "tombstone_s"}
	operatorFields   = []string{"reason"}
	heartbeatFields  = []string{"lease_ms", "owner_token"}
	completeFields   = []string{"owner_token", "response", "retention_s"}
	releaseFields    = []string{"owner_token"}
	responseFields   = []string{"body", "headers", "status"}
)

// fieldsBuf is room for the members of a request object on the caller's
// stack: var buf fieldsBuf; jsonObject(..., buf[:0]).
type fieldsBuf [8]jsonField

// jsonObject decodes data, which must be exactly one JSON object (or nothing
// at all: an empty body is an empty object), and rejects fields not in
// allowed. where names the object in messages ("request body", "response").
// The members are appended to buf.
func jsonObject(p *problems, data []byte, allowed []string, where string, buf jsonFields) jsonFields {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil
	}
	if data[0] != '{' {
		p.addf("%s must be a JSON object like {\"%s\": ...}", where, allowed[0])
		return nil
	}
	// The fast path takes only valid UTF-8; the slow one checks it first.
	fields, ok := scanObject(data, buf)
	if !ok {
		if !utf8.Valid(data) {
			p.addf("%s is not valid UTF-8 (byte %d): JSON text is UTF-8; send strings as UTF-8 text", where, invalidUTF8At(data))
			return nil
		}
		if fields, ok = jsonObjectSlow(p, data, where, buf); !ok {
			return nil
		}
	}
	var unknown []string
	for _, f := range fields {
		if !slices.Contains(allowed, string(f.name)) {
			unknown = append(unknown, strconv.Quote(truncate(string(f.name), 64)))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		p.addf("unknown field %s in %s: the allowed fields are %s (names are snake_case and case-sensitive)",
			strings.Join(unknown, ", "), where, strings.Join(allowed, ", "))
	}
	return fields
}

// jsonObjectSlow is jsonObject's way for what scanObject does not take:
// encoding/json decodes data into a map of raw values.
func jsonObjectSlow(p *problems, data []byte, where string, buf jsonFields) (jsonFields, bool) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		var syntaxErr *json.SyntaxError
		if errors.As(err, &syntaxErr) {
			p.addf("%s is not valid JSON (%s at byte %d): send exactly one JSON object", where,
				strings.TrimPrefix(syntaxErr.Error(), "json: "), syntaxErr.Offset)
		} else {
			p.addf("%s is not valid JSON: send exactly one JSON object", where)
		}
		return nil, false
	}
	if dup, ok := duplicateMember(data, false); ok {
		p.addf("%s names field %q twice: send each field once", where, truncate(dup, 64))
		return nil, false
	}
	for name, raw := range fields {
		buf = append(buf, jsonField{name: []byte(name), raw: raw})
	}
	return buf, true
}

// CheckJSONText is the INVALID_ARGUMENT for what a JSON request body holds
// that encoding/json would decode into something else than was sent: bytes
// that are not UTF-8, or an object, at any depth, that names a member twice
// (encoding/json keeps the last). nil when there is neither, or when data is
// not valid JSON (encoding/json says so). For handlers that decode a body
// with encoding/json (a node's topology API); this package's own decoding
// refuses the same and more.
func CheckJSONText(data []byte) *Error {
	var p problems
	if !utf8.Valid(data) {
		p.addf("request body is not valid UTF-8 (byte %d): JSON text is UTF-8; send strings as UTF-8 text", invalidUTF8At(data))
		return p.err()
	}
	if dup, ok := duplicateMember(data, true); ok {
		p.addf("request body names field %q twice: send each field once", truncate(dup, 128))
	}
	return p.err()
}

// duplicateMember reports a member that an object of data holds twice, by
// its path ("response.status", "regions[0].name"). Deep or not: only the
// members of data's own object when not, since the objects nested in a
// request body (response, its headers, batch items) are decoded by
// jsonObject and jsonHeaders, which check their own. data must be valid
// JSON; a path is reported only for valid JSON.
func duplicateMember(data []byte, deep bool) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	// walk reads one value; a member named twice is reported by its path.
	var walk func(path string, depth int) (string, bool)
	walk = func(path string, depth int) (string, bool) {
		if depth > 0 && !deep {
			var skip json.RawMessage
			_ = dec.Decode(&skip)
			return "", false
		}
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return "", false
				}
				name, _ := tok.(string)
				member := name
				if path != "" {
					member = path + "." + name
				}
				if seen[name] {
					return member, true
				}
				seen[name] = true
				if dup, ok := walk(member, depth+1); ok {
					return dup, true
				}
			}
			_, _ = dec.Token() // '}'
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if dup, ok := walk(path+"["+strconv.Itoa(i)+"]", depth+1); ok {
					return dup, true
				}
			}
			_, _ = dec.Token() // ']'
		}
		return "", false
	}
	return walk("", 0)
}

// invalidUTF8At is the offset of the first byte of data that is not part of
// valid UTF-8.
func invalidUTF8At(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(data)
}

// loneSurrogate reports whether the JSON string literal raw escapes half of a
// UTF-16 surrogate pair (\ud800 not followed by \udc00-\udfff, or a low
// half alone), which encoding/json decodes to U+FFFD.
func loneSurrogate(raw []byte) bool {
	hex4 := func(b []byte) (rune, bool) {
		if len(b) < 4 {
			return 0, false
		}
		n, err := strconv.ParseUint(string(b[:4]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++
		if i >= len(raw) || raw[i] != 'u' {
			continue // a one-character escape: skipped whole
		}
		r, ok := hex4(raw[i+1:])
		if !ok {
			return false // not valid JSON: encoding/json says so
		}
		i += 4
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return true
		case r >= 0xd800 && r <= 0xdbff:
			if i+6 >= len(raw) || raw[i+1] != '\\' || raw[i+2] != 'u' {
				return true
			}
			low, ok := hex4(raw[i+3:])
			if !ok || low < 0xdc00 || low > 0xdfff {
				return true
			}
			i += 6
		}
	}
	return false
}

func isNull(raw json.RawMessage) bool { return raw == nil || string(raw) == "null" }

// jsonString decodes a string field; absent or null is "".
func jsonString(p *problems, fields jsonFields, name, path string) string {
	raw := fields.get(name)
	if isNull(raw) {
		return ""
	}
	if s, ok := plainJSONString(raw); ok {
		return s
	}
	var s string
	if raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		p.addf("%s must be a JSON string", path)
		return ""
	}
	if loneSurrogate(raw) {
		p.addf("%s escapes half of a UTF-16 surrogate pair (\\ud800-\\udfff without its other half): send valid UTF-8 text", path)
		return ""
	}
	return s
}

// plainJSONString returns the contents of a string literal made only of
// printable ASCII without escapes, which decodes to exactly those bytes:
// owner tokens and base64 bodies, whose second full scan by encoding/json
// (validate, then unquote) is the costliest part of decoding a complete.
// Anything else (escapes, non-ASCII, not a string) answers false and goes
// through encoding/json.
func plainJSONString(raw []byte) (string, bool) {
	inner, ok := plainJSONBytes(raw)
	if !ok {
		return "", false
	}
	return string(inner), true
}

// plainJSONBytes is plainJSONString without the copy: the contents are a
// slice of raw.
func plainJSONBytes(raw []byte) ([]byte, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return nil, false
	}
	inner := raw[1 : len(raw)-1]
	for _, c := range inner {
		if c < 0x20 || c >= 0x7f || c == '\\' || c == '"' {
			return nil, false
		}
	}
	return inner, true
}

// jsonInt decodes an integer field; absent or null is 0. A number written
// with a fraction or exponent is accepted when its value is a whole number
// (30000.0, 3e4), since many encoders write numbers that way.
func jsonInt(p *problems, fields jsonFields, name, path string) int64 {
	raw := fields.get(name)
	if isNull(raw) {
		return 0
	}
	if c := raw[0]; c != '-' && (c < '0' || c > '9') {
		p.addf("%s must be a JSON number, not %s", path, jsonKind(raw))
		return 0
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.Abs(f) > 1<<53 {
		p.addf("%s %s is out of range", path, truncate(string(raw), 32))
		return 0
	}
	if f != math.Trunc(f) {
		p.addf("%s must be a whole number, not %s", path, truncate(string(raw), 32))
		return 0
	}
	return int64(f)
}

func jsonKind(raw json.RawMessage) string {
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	}
	return "that value"
}

func decodeReserve(data []byte) (reserveParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, reserveFields, "request body", buf[:0])
	r := reserveParams{
		Fingerprint: jsonString(&p, f, "fingerprint", "fingerprint"),
		LeaseMs:     jsonInt(&p, f, "lease_ms", "lease_ms"),
		OwnerToken:  jsonString(&p, f, "owner_token", "owner_token"),
		WaitMs:      jsonInt(&p, f, "wait_ms", "wait_ms"),
		IfExpired:   jsonString(&p, f, "if_expired", "if_expired"),
	}
	return r, p.err()
}

// decodeCheckpoint decodes the body of a checkpoint (v1.2).
func decodeCheckpoint(data []byte) (checkpointParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, checkpointFields, "request body", buf[:0])
	r := checkpointParams{
		OwnerToken: jsonString(&p, f, "owner_token", "owner_token"),
		Name:       jsonString(&p, f, "name", "name"),
	}
	r.Data = jsonBase64(&p, f, "data", "data")
	return r, p.err()
}

// decodePolicy decodes the body of a set-policy (v1.2): a field absent or
// null keeps the built-in default, so presence is kept.
func decodePolicy(data []byte) (policyParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, policyFields, "request body", buf[:0])
	opt := func(name string) *int64 {
		if isNull(f.get(name)) {
			return nil
		}
		v := jsonInt(&p, f, name, name)
		return &v
	}
	r := policyParams{
		DefaultLeaseMs:    opt("default_lease_ms"),
		MaxLeaseMs:        opt("max_lease_ms"),
		DefaultRetentionS: opt("default_retention_s"),
		MaxRetentionS:     opt("max_retention_s"),
		TombstoneS:        opt("tombstone_s"),
	}
	return r, p.err()
}

// decodeOperator decodes the body of a force-release or delete.
func decodeOperator(data []byte) (operatorParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, operatorFields, "request body", buf[:0])
	return operatorParams{Reason: jsonString(&p, f, "reason", "reason")}, p.err()
}

func decodeHeartbeat(data []byte) (heartbeatParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, heartbeatFields, "request body", buf[:0])
	r := heartbeatParams{
		LeaseMs:    jsonInt(&p, f, "lease_ms", "lease_ms"),
		OwnerToken: jsonString(&p, f, "owner_token", "owner_token"),
	}
	return r, p.err()
}

func decodeRelease(data []byte) (releaseParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, releaseFields, "request body", buf[:0])
	r := releaseParams{OwnerToken: jsonString(&p, f, "owner_token", "owner_token")}
	return r, p.err()
}

func decodeComplete(data []byte) (completeParams, *Error) {
	var p problems
	var buf fieldsBuf
	f := jsonObject(&p, data, completeFields, "request body", buf[:0])
	r := completeFromFields(&p, f)
	return r, p.err()
}

// completeFromFields reads a complete's fields (a body's or a batch item's).
func completeFromFields(p *problems, f jsonFields) completeParams {
	r := completeParams{
		OwnerToken: jsonString(p, f, "owner_token", "owner_token"),
		RetentionS: jsonInt(p, f, "retention_s", "retention_s"),
	}
	if raw := f.get("response"); !isNull(raw) {
		if raw[0] != '{' {
			p.addf("response must be a JSON object like {\"status\": 200, \"headers\": {}, \"body\": \"\"}, not %s", jsonKind(raw))
		} else {
			var buf fieldsBuf
			rf := jsonObject(p, raw, responseFields, "response", buf[:0])
			resp := &responseParams{
				Status:  jsonInt(p, rf, "status", "response.status"),
				Headers: jsonHeaders(p, rf),
			}
			resp.Body = jsonBase64(p, rf, "body", "response.body")
			r.Response = resp
		}
	}
	return r
}

func jsonHeaders(p *problems, fields jsonFields) map[string]string {
	raw := fields.get("headers")
	if isNull(raw) {
		return nil
	}
	if out, ok := plainHeaders(raw); ok {
		return out
	}
	var headers map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &headers) != nil {
		p.addf("response.headers must be a JSON object of strings like {\"Content-Type\": \"application/json\"}")
		return nil
	}
	if dup, ok := duplicateMember(raw, false); ok {
		p.addf("response.headers names field %q twice: send each header once (join multiple values with \", \")", truncate(dup, 64))
		return nil
	}
	out := make(map[string]string, len(headers))
	for name, value := range headers {
		var s string
		if len(value) == 0 || value[0] != '"' || json.Unmarshal(value, &s) != nil {
			p.addf("response.headers[%q] must be a string (join multiple values with \", \")", truncate(name, 64))
			continue
		}
		if loneSurrogate(value) {
			p.addf("response.headers[%q] escapes half of a UTF-16 surrogate pair: send valid UTF-8 text", truncate(name, 64))
			continue
		}
		out[name] = s
	}
	return out
}

// plainHeaders is jsonHeaders' fast path: an object that scanObject takes
// whose values are all plain strings (plainJSONString).
func plainHeaders(raw []byte) (map[string]string, bool) {
	var buf fieldsBuf
	headers, ok := scanObject(raw, buf[:0])
	if !ok {
		return nil, false
	}
	out := make(map[string]string, len(headers))
	for _, h := range headers {
		v, ok := plainJSONString(h.raw)
		if !ok {
			return nil, false
		}
		out[string(h.name)] = v
	}
	return out, true
}

// jsonBase64 decodes a base64 string field; absent, null or "" is nil.
func jsonBase64(p *problems, fields jsonFields, name, path string) []byte {
	var decoded []byte
	var err error
	if inner, ok := plainJSONBytes(fields.get(name)); ok {
		// Decoded straight from the body, without a string copy first.
		if len(inner) == 0 {
			return nil
		}
		decoded, err = decodeBase64(inner)
	} else {
		s := jsonString(p, fields, name, path)
		if s == "" {
			return nil
		}
		decoded, err = decodeBase64([]byte(s))
	}
	if err != nil {
		p.addf("%s is not valid base64 (%v): encode it as base64, standard or URL-safe alphabet, padded or not", path, err)
	}
	return decoded
}

// decodeBase64 accepts the standard and the URL-safe alphabet, padded or
// not (the alphabet is the one the characters show; padding is checked when
// present).
func decodeBase64(s []byte) ([]byte, error) {
	enc := base64.StdEncoding
	if bytes.ContainsAny(s, "-_") {
		enc = base64.URLEncoding
	}
	if !bytes.HasSuffix(bytes.TrimRight(s, "\r\n"), []byte("=")) {
		enc = enc.WithPadding(base64.NoPadding)
	}
	out := make([]byte, enc.DecodedLen(len(s)))
	n, err := enc.Decode(out, s)
	return out[:n], err
}
