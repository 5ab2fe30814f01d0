package server

import (
	"encoding/json"
	"unicode/utf8"
)

// The fast path of request decoding: one pass over a body that splits an
// object into its members without building a map or copying a value. It
// takes only what it decodes exactly as encoding/json would (valid JSON in
// valid UTF-8, member names of printable ASCII without escapes, no name
// twice, nesting at most maxScanDepth deep); anything else answers false
// and goes the slow way, through encoding/json, which also writes the error
// messages (and refuses what is not UTF-8, which encoding/json would turn
// into U+FFFD).
// So the fast path changes what a body costs, never what it means.

// jsonField is one member of a JSON object: its name and its raw value
// (without the whitespace around it), both slices of the body.
type jsonField struct {
	name []byte
	raw  []byte
}

// jsonFields are an object's members; objects have a handful, so lookups
// are linear.
type jsonFields []jsonField

// get is the raw value of member name, nil when absent.
func (f jsonFields) get(name string) json.RawMessage {
	for i := range f {
		if string(f[i].name) == name {
			return f[i].raw
		}
	}
	return nil
}

// scanFast turns the fast path on; tests turn it off to compare both ways.
var scanFast = true

// maxScanDepth bounds the nesting the fast path follows; deeper values go
// the slow way.
const maxScanDepth = 32

// scanObject splits data, which must hold exactly one JSON object and
// nothing but JSON whitespace after it, into its members appended to buf.
// ok is false when the fast path does not take data.
func scanObject(data []byte, buf jsonFields) (fields jsonFields, ok bool) {
	if !scanFast {
		return nil, false
	}
	s := scanner{data: data}
	s.space()
	if !s.consume('{') {
		return nil, false
	}
	fields = buf
	s.space()
	if !s.consume('}') {
		for {
			name, ok := s.plainName()
			if !ok {
				return nil, false
			}
			for i := range fields {
				if string(fields[i].name) == string(name) {
					return nil, false // the slow path refuses a member named twice
				}
			}
			s.space()
			if !s.consume(':') {
				return nil, false
			}
			s.space()
			start := s.i
			if !s.value(0) {
				return nil, false
			}
			fields = append(fields, jsonField{name: name, raw: data[start:s.i]})
			s.space()
			if s.consume('}') {
				break
			}
			if !s.consume(',') {
				return nil, false
			}
			s.space()
		}
	}
	s.space()
	return fields, s.i == len(data)
}

type scanner struct {
	data []byte
	i    int
}

func (s *scanner) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) consume(c byte) bool {
	if s.i < len(s.data) && s.data[s.i] == c {
		s.i++
		return true
	}
	return false
}

// plainName reads a member name of printable ASCII without escapes and
// returns it without its quotes.
func (s *scanner) plainName() ([]byte, bool) {
	if !s.consume('"') {
		return nil, false
	}
	start := s.i
	for s.i < len(s.data) {
		c := s.data[s.i]
		if c == '"' {
			s.i++
			return s.data[start : s.i-1], true
		}
		if c < 0x20 || c >= 0x7f || c == '\\' {
			return nil, false
		}
		s.i++
	}
	return nil, false
}

// value skips one JSON value, checking it as encoding/json's scanner does.
func (s *scanner) value(depth int) bool {
	if s.i >= len(s.data) || depth > maxScanDepth {
		return false
	}
	switch c := s.data[s.i]; {
	case c == '"':
		return s.str()
	case c == '{':
		s.i++
		s.space()
		if s.consume('}') {
			return true
		}
		for {
			if s.i >= len(s.data) || s.data[s.i] != '"' || !s.str() {
				return false
			}
			s.space()
			if !s.consume(':') {
				return false
			}
			s.space()
			if !s.value(depth + 1) {
				return false
			}
			s.space()
			if s.consume('}') {
				return true
			}
			if !s.consume(',') {
				return false
			}
			s.space()
		}
	case c == '[':
		s.i++
		s.space()
		if s.consume(']') {
			return true
		}
		for {
			if !s.value(depth + 1) {
				return false
			}
			s.space()
			if s.consume(']') {
				return true
			}
			if !s.consume(',') {
				return false
			}
			s.space()
		}
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if len(s.data)-s.i < len(lit) || string(s.data[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// str skips a string: no control characters, valid escapes, valid UTF-8
// (outside strings, JSON text is ASCII).
func (s *scanner) str() bool {
	s.i++ // the opening quote
	for s.i < len(s.data) {
		c := s.data[s.i]
		switch {
		case c == '"':
			s.i++
			return true
		case c < 0x20:
			return false
		case c == '\\':
			s.i++
			if s.i >= len(s.data) {
				return false
			}
			switch s.data[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				if len(s.data)-s.i < 5 {
					return false
				}
				for _, h := range s.data[s.i+1 : s.i+5] {
					if !isHex(h) {
						return false
					}
				}
				s.i += 5
			default:
				return false
			}
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(s.data[s.i:])
			if r == utf8.RuneError && n == 1 {
				return false
			}
			s.i += n
		default:
			s.i++
		}
	}
	return false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// number skips -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) number() bool {
	s.consume('-')
	if s.consume('0') {
		// no further integer digits
	} else if !s.digits() {
		return false
	}
	if s.consume('.') && !s.digits() {
		return false
	}
	if s.i < len(s.data) && (s.data[s.i] == 'e' || s.data[s.i] == 'E') {
		s.i++
		if !s.consume('+') {
			s.consume('-')
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits skips one or more decimal digits.
func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.data) && s.data[s.i] >= '0' && s.data[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
