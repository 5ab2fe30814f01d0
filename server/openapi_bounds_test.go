package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/idem-dev/idem/api/openapi/openapitest"
)

// oaBaseCalls are a request of each operation with a body or parameters that
// the server accepts (2xx, or an answer about the key's state such as 404 or
// 409: never 400), into which TestOpenAPIBoundsAgreeWithTheServer puts one
// boundary value at a time. A body holds every object the schema nests
// (response, its headers, one batch item) so that their fields have a place;
// the bounded fields themselves are found by walking the document, not
// listed here. Each operation gets its own namespace, so that a policy set
// by one does not bound another's leases.
var oaBaseCalls = map[string]struct {
	query url.Values
	body  string
}{
	"POST " + oaReserve:      {body: `{"fingerprint":"f"}`},
	"POST " + oaHeartbeat:    {body: `{"owner_token":"owner-token-00001"}`},
	"POST " + oaComplete:     {body: `{"owner_token":"owner-token-00001","response":{"status":200,"headers":{"X-A":"b"},"body":"aGk="}}`},
	"POST " + oaRelease:      {body: `{"owner_token":"owner-token-00001"}`},
	"POST " + oaCheckpoint:   {body: `{"owner_token":"owner-token-00001","name":"step"}`},
	"POST " + oaForceRelease: {body: `{"reason":"r"}`},
	"GET " + oaKey:           {},
	"DELETE " + oaKey:        {body: `{"reason":"r"}`},
	"GET " + oaList:          {query: url.Values{"state": {"IN_PROGRESS"}}},
	"POST " + oaBatchReserve: {body: `{"items":[{"key":"b","owner_token":"owner-token-00001"}]}`},
	"POST " + oaBatchComplete: {body: `{"items":[{"key":"b","owner_token":"owner-token-00001",` +
		`"response":{"status":200,"headers":{"X-A":"b"},"body":"aGk="}}]}`},
	"GET " + oaPolicy: {},
	"PUT " + oaPolicy: {body: `{}`},
}

// oaOpaque are fields whose values the server refuses for reasons no schema
// can state (a page token it did not issue): for them only "the schema
// refuses, so the server refuses" is checked.
var oaOpaque = map[string]bool{"query page_token": true}

// oaByteCounted are string fields whose length the server counts in bytes,
// as HTTP does, where JSON Schema's maxLength counts characters (the
// document says so): their boundary values are ASCII only.
var oaByteCounted = map[string]bool{"body response.headers.*": true, "body items.0.response.headers.*": true}

// oaProbeRunes replace one character of a valid value to try a pattern.
var oaProbeRunes = []string{" ", "/", ":", "%", "é", "\x01", "\x7f", "\t", ".", "=", "+", "-", "_", "!", "~", "A", "0", "\u0085", "\"", "\\"}

// oaValue is one boundary value of a field, ready to be put in a request.
type oaValue struct {
	where string // "body response.status", "path key", "query limit"
	label string // "max+1", "pattern '/'"
	put   func(c *openapitest.Call)
}

// TestOpenAPIBoundsAgreeWithTheServer sends every boundary value of every
// bounded field of every operation in openapi.json (minimum-1, minimum,
// maximum, maximum+1 for numbers, lengths and item counts; each constant and
// enum member and one outside; characters in and outside each pattern) to a
// real server, one value at a time in an otherwise valid request, and checks
// that the document's verdict (kin-openapi, JSON Schema 2020-12) is the
// server's: the schema refuses exactly what the server answers 400
// INVALID_ARGUMENT (for a batch call, an item refused so).
func TestOpenAPIBoundsAgreeWithTheServer(t *testing.T) {
	h := newHarness(t, newMemBackend(newFakeClock()), nil)
	v := openapitest.New(t)
	client := &http.Client{Timeout: 30 * time.Second}
	seq := 0
	for _, op := range v.Operations() {
		method, template, _ := strings.Cut(op, " ")
		operation := v.Doc.Paths.Value(template).GetOperation(method)
		values := oaBoundaryValues(t, v.Doc.Paths.Value(template).Parameters, operation)
		if oaNodeOnly[op] {
			if len(values) > 0 {
				t.Errorf("%s: %d boundary values, but this test's server does not serve it: send them to a node", op, len(values))
			}
			continue
		}
		base, ok := oaBaseCalls[op]
		if !ok {
			if len(values) > 0 || operation.RequestBody != nil {
				t.Errorf("%s: no base request in oaBaseCalls", op)
			}
			continue
		}
		nsName := fmt.Sprintf("bounds-%d", seq)
		seq++
		checked := 0
		for _, val := range values {
			seq++
			c := openapitest.Call{Method: method, Template: template, Params: map[string]string{}, Query: url.Values{}, Body: base.body}
			for name, vs := range base.query {
				c.Query[name] = slices.Clone(vs)
			}
			if strings.Contains(template, "{ns}") {
				c.Params["ns"] = nsName
			}
			if strings.Contains(template, "{key}") {
				c.Params["key"] = fmt.Sprintf("k-%d", seq) // a fresh key: no state in the way
			}
			val.put(&c)
			schemaErr := v.RequestError(t, c)
			r := v.Do(t, client, h.httpURL, c)
			refused := r.Status == http.StatusBadRequest || openapitest.ItemRefused(r) ||
				// An empty path segment is another path: no such route.
				oaEmptyPathParam(c) && r.Status == http.StatusNotFound

			if r.Status >= 500 || r.Status == http.StatusRequestEntityTooLarge {
				t.Errorf("%s %s %s: %s", op, val.where, val.label, r)
				continue
			}
			checked++
			switch {
			case schemaErr != nil && !refused:
				t.Errorf("%s, %s = %s: openapi.json refuses it, the server answered %s\nschema: %.400v", op, val.where, val.label, r, schemaErr)
			case schemaErr == nil && refused && !oaOpaque[val.where]:
				t.Errorf("%s, %s = %s: openapi.json accepts it, the server refused it: %s", op, val.where, val.label, r)
			}
		}
		if checked == 0 && len(values) > 0 {
			t.Errorf("%s: no boundary value checked", op)
		}
		t.Logf("%s: %d boundary values", op, checked)
	}
}

func oaEmptyPathParam(c openapitest.Call) bool {
	for _, v := range c.Params {
		if v == "" {
			return true
		}
	}
	return false
}

// oaBoundaryValues walks an operation's parameters and request body schema
// and returns the boundary values of every bounded field.
func oaBoundaryValues(t *testing.T, pathParams openapi3.Parameters, op *openapi3.Operation) []oaValue {
	var out []oaValue
	for _, p := range append(slices.Clone(pathParams), op.Parameters...) {
		param := p.Value
		where := param.In + " " + param.Name
		for _, lv := range oaLeafValues(where, param.Schema.Value) {
			name, in := param.Name, param.In
			out = append(out, oaValue{where: where, label: lv.label, put: func(c *openapitest.Call) {
				s, ok := lv.v.(string)
				if !ok {
					s = strconv.FormatInt(lv.v.(int64), 10)
				}
				if in == "path" {
					c.Params[name] = s
				} else {
					c.Query.Set(name, s)
				}
			}})
		}
	}
	if op.RequestBody != nil {
		schema := op.RequestBody.Value.Content.Get("application/json").Schema.Value
		oaWalk(t, schema, nil, func(path []string, label string, v any) {
			out = append(out, oaValue{where: "body " + strings.Join(path, "."), label: label, put: func(c *openapitest.Call) {
				c.Body = oaSet(t, c.Body, path, v)
			}})
		})
	}
	return out
}

// oaWalk calls emit for each boundary value of the bounded fields of schema,
// found at path of the body.
func oaWalk(t *testing.T, s *openapi3.Schema, path []string, emit func(path []string, label string, v any)) {
	where := "body " + strings.Join(path, ".")
	switch {
	case s.Type.Is("object") && len(s.Properties) > 0:
		for name, p := range s.Properties {
			oaWalk(t, p.Value, append(slices.Clone(path), name), emit)
		}
	case s.Type.Is("object"):
		// A map (response.headers): its size, its names, its values.
		if s.MaxProps != nil {
			for _, n := range []uint64{*s.MaxProps, *s.MaxProps + 1} {
				m := map[string]any{}
				for i := range n {
					m[fmt.Sprintf("X-H%d", i)] = "v"
				}
				emit(path, fmt.Sprintf("%d entries (maxProperties %d)", n, *s.MaxProps), m)
			}
		}
		if s.PropertyNames != nil {
			for _, lv := range oaLeafValues(where+" names", s.PropertyNames.Value) {
				emit(path, "name "+lv.label, map[string]any{lv.v.(string): "v"})
			}
		}
		if ap := s.AdditionalProperties.Schema; ap != nil {
			for _, lv := range oaLeafValues(where+".*", ap.Value) {
				emit(path, "value "+lv.label, map[string]any{"X-V": lv.v})
			}
		}
	case s.Type.Is("array"):
		var counts []uint64
		if s.MinItems > 0 {
			counts = append(counts, s.MinItems-1, s.MinItems)
		}
		if s.MaxItems != nil {
			counts = append(counts, *s.MaxItems, *s.MaxItems+1)
		}
		for _, n := range counts {
			emit(path, fmt.Sprintf("%d items", n), oaRepeatFirst(n))
		}
		oaWalk(t, s.Items.Value, append(slices.Clone(path), "0"), emit)
	default:
		for _, lv := range oaLeafValues(where, s) {
			emit(path, lv.label, lv.v)
		}
	}
}

// oaRepeatFirst marks a value that oaSet replaces by n copies of the
// array's first element.
type oaRepeatFirst uint64

type oaLeaf struct {
	label string
	v     any // int64 or string
}

// oaLeafValues are the boundary values of a number or string schema,
// including those of its anyOf branches.
func oaLeafValues(where string, s *openapi3.Schema) []oaLeaf {
	schemas := []*openapi3.Schema{s}
	for _, b := range s.AnyOf {
		schemas = append(schemas, b.Value)
	}
	isInt, isString := false, false
	for _, x := range schemas {
		isInt = isInt || x.Type.Is("integer")
		isString = isString || x.Type.Is("string")
		if c, ok := x.Const.(string); ok || x.Enum != nil && len(x.Enum) > 0 {
			_ = c
			isString = isString || ok
		}
	}
	var out []oaLeaf
	add := func(label string, v any) {
		for _, o := range out {
			if o.v == v {
				return
			}
		}
		out = append(out, oaLeaf{label, v})
	}
	if isInt {
		for _, x := range schemas {
			if x.Min != nil {
				add("minimum-1", int64(*x.Min)-1)
				add("minimum", int64(*x.Min))
			}
			if x.Max != nil {
				add("maximum", int64(*x.Max))
				add("maximum+1", int64(*x.Max)+1)
			}
			if c, ok := x.Const.(float64); ok {
				add("const-1", int64(c)-1)
				add("const", int64(c))
				add("const+1", int64(c)+1)
			}
		}
		return out
	}
	if !isString {
		return nil
	}
	var patterns []*regexp.Regexp
	minLen, maxLen, base64ed := uint64(0), uint64(0), false
	hasMax := false
	for _, x := range schemas {
		if x.Pattern != "" {
			// ECMA-262's \uXXXX is Go's \x{XXXX}.
			patterns = append(patterns, regexp.MustCompile(oaUnicodeEscape.ReplaceAllString(x.Pattern, `\x{$1}`)))
		}
		minLen = max(minLen, x.MinLength)
		if x.MaxLength != nil {
			maxLen, hasMax = *x.MaxLength, true
		}
		base64ed = base64ed || x.ContentEncoding == "base64"
		if c, ok := x.Const.(string); ok {
			add(fmt.Sprintf("const %q", c), c)
		}
		for _, e := range x.Enum {
			add(fmt.Sprintf("enum %q", e), e.(string))
			add(fmt.Sprintf("not enum %q", "x"+e.(string)), "x"+e.(string))
		}
	}
	matches := func(s string) bool {
		for _, re := range patterns {
			if !re.MatchString(s) {
				return false
			}
		}
		return true
	}
	// The filler: a character whose repetitions match the patterns.
	// The filler: a character whose repetitions (of probeLen, a length the
	// patterns take) match the patterns.
	filler, probeLen := "", 0
	for _, n := range []int{int(max(minLen, 4)), 16, 64} {
		if hasMax && n > int(maxLen) {
			continue
		}
		for _, c := range []string{"a", "A", "0", "-"} {
			if filler == "" && matches(strings.Repeat(c, n)) {
				filler, probeLen = c, n
			}
		}
	}
	if base64ed {
		// Lengths of a base64 field are those of its encodings, padded and
		// not, of the byte counts around each maxLength.
		var lens []uint64
		for _, x := range schemas {
			if x.MaxLength != nil {
				lens = append(lens, *x.MaxLength)
			}
		}
		for _, l := range lens {
			for n := int(l)/4*3 - 2; n <= int(l)/4*3+1; n++ {
				add(fmt.Sprintf("base64 of %d bytes, padded", n), base64.StdEncoding.EncodeToString(make([]byte, n)))
				add(fmt.Sprintf("base64 of %d bytes, unpadded", n), base64.RawStdEncoding.EncodeToString(make([]byte, n)))
			}
		}
		for _, v := range []string{"AA", "AAA", "AAAA", "AA==", "AAA=", "A", "AA=", "A===", "AA-_", "AA+/", "AA+_", "AA A", "AA.A", "AAé="} {
			add(fmt.Sprintf("base64 %q", v), v)
		}
		return out
	}
	if filler == "" && len(patterns) > 0 {
		// No value of this test's making matches: the schema refuses all
		// of them, which the server must then do too.
		add("pattern: no filler matches", "a")
		return out
	}
	if filler == "" {
		filler, probeLen = "a", 4
	}
	if minLen > 0 {
		add(fmt.Sprintf("minLength-1 (%d)", minLen-1), strings.Repeat(filler, int(minLen-1)))
		add(fmt.Sprintf("minLength (%d)", minLen), strings.Repeat(filler, int(minLen)))
	}
	if hasMax {
		add(fmt.Sprintf("maxLength (%d)", maxLen), strings.Repeat(filler, int(maxLen)))
		add(fmt.Sprintf("maxLength+1 (%d)", maxLen+1), strings.Repeat(filler, int(maxLen+1)))
		if len(patterns) == 0 && !oaByteCounted[where] {
			// Lengths count characters, not bytes.
			add(fmt.Sprintf("maxLength (%d) of 'é'", maxLen), strings.Repeat("é", int(maxLen)))
			add(fmt.Sprintf("maxLength+1 (%d) of 'é'", maxLen+1), strings.Repeat("é", int(maxLen+1)))
		}
	}
	if len(patterns) > 0 {
		n := probeLen
		for _, r := range oaProbeRunes {
			if oaByteCounted[where] && r == "é" {
				continue
			}
			for _, at := range []int{0, n / 2} {
				s := strings.Repeat(filler, at) + r + strings.Repeat(filler, n-at-1)
				add(fmt.Sprintf("pattern: %q at %d", r, at), s)
			}
		}
	}
	return out
}

var oaUnicodeEscape = regexp.MustCompile(`\\u([0-9A-Fa-f]{4})`)

// oaSet puts v at path (member names and array indices) of the JSON body.
func oaSet(t *testing.T, body string, path []string, v any) string {
	var root any
	if err := json.Unmarshal([]byte(body), &root); err != nil {
		t.Fatalf("base body %s: %v", body, err)
	}
	var set func(node any, path []string) any
	set = func(node any, path []string) any {
		if len(path) == 0 {
			if n, ok := v.(oaRepeatFirst); ok {
				first := node.([]any)[0]
				out := make([]any, n)
				for i := range out {
					out[i] = first
				}
				return out
			}
			return v
		}
		switch n := node.(type) {
		case map[string]any:
			n[path[0]] = set(n[path[0]], path[1:])
			return n
		case []any:
			i, _ := strconv.Atoi(path[0])
			n[i] = set(n[i], path[1:])
			return n
		case nil:
			return set(map[string]any{}, path)
		}
		t.Fatalf("base body %s has no place for %v", body, path)
		return nil
	}
	out, err := json.Marshal(set(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
