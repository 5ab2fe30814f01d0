package docs

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	idemv1 "github.com/idem-dev/idem/api/idem/v1"
	"github.com/idem-dev/idem/api/openapi"
	"github.com/idem-dev/idem/backend"
	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
	"github.com/idem-dev/idem/server"
)

// api.md is the public contract; these tests check it against the code where
// that is cheap: the error codes and their mappings, the reserve outcomes and
// the JSON routes.

func readAPIDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("api.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of the level-2 section titled title: from its
// heading to the next level-2 heading.
func section(t *testing.T, doc, title string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n## "+title+"\n")
	if !ok {
		t.Fatalf("api.md has no section %q", title)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// parseGoFile parses a file of the repository, relative to its root.
func parseGoFile(t *testing.T, path string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", path), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// contractCodes returns the values of the constants of type Code declared in
// contract/codes.go, in declaration order.
func contractCodes(t *testing.T) []contract.Code {
	t.Helper()
	var out []contract.Code
	for _, decl := range parseGoFile(t, "contract/codes.go").Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					t.Fatalf("contract/codes.go: a Code constant that is not a string literal: %#v", v)
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, contract.Code(s))
			}
		}
	}
	return out
}

// grpcName spells a gRPC code as the gRPC documentation does:
// FailedPrecondition -> FAILED_PRECONDITION.
func grpcName(camel string) string {
	var b strings.Builder
	for i, r := range camel {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// errorRow matches a row of the Errors table: code, HTTP status, gRPC code.
var errorRow = regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| ([0-9]{3}) \\| `([A-Z_]+)` \\|")

// TestAPIDocErrorCodes checks that the Errors table of api.md has one row for
// every error code of contract/codes.go, with the HTTP status and gRPC code
// the code maps it to, and no row for a code the code does not have.
func TestAPIDocErrorCodes(t *testing.T) {
	codes := contractCodes(t)
	if len(codes) < 10 {
		t.Fatalf("found %d codes in contract/codes.go (%v): the parser missed some", len(codes), codes)
	}
	rows := map[string][2]string{}
	for _, m := range errorRow.FindAllStringSubmatch(section(t, readAPIDoc(t), "Errors"), -1) {
		if _, dup := rows[m[1]]; dup {
			t.Errorf("api.md, Errors: two rows for %s", m[1])
		}
		rows[m[1]] = [2]string{m[2], m[3]}
	}
	for _, c := range codes {
		if !c.Known() {
			t.Errorf("contract/codes.go declares %s but Code.Known says no", c)
		}
		want := [2]string{strconv.Itoa(c.HTTPStatus()), grpcName(idemv1.GRPCCode(c).String())}
		got, ok := rows[string(c)]
		switch {
		case !ok:
			t.Errorf("api.md, Errors: no row for %s (want HTTP %s, gRPC %s)", c, want[0], want[1])
		case got != want:
			t.Errorf("api.md, Errors: %s is HTTP %s, gRPC %s; the code maps it to HTTP %s, gRPC %s", c, got[0], got[1], want[0], want[1])
		}
		delete(rows, string(c))
	}
	for c := range rows {
		t.Errorf("api.md, Errors: a row for %s, which contract/codes.go does not declare", c)
	}
}

// TestAPIDocOutcomes checks that the reserve's outcome table names every
// outcome the store can decide.
func TestAPIDocOutcomes(t *testing.T) {
	doc := readAPIDoc(t)
	n := 0
	for o := contract.OutcomeUnknown + 1; !strings.HasPrefix(o.String(), "Outcome("); o++ {
		n++
		if !strings.Contains(doc, "\n| `"+o.String()+"`") {
			t.Errorf("api.md: the outcome table has no row for %s", o)
		}
	}
	if n < 6 {
		t.Fatalf("found %d outcomes: want at least the six of v1.2", n)
	}
}

// mapKeys returns the string keys of the map literal assigned to the
// package-level variable name in f.
func mapKeys(t *testing.T, f *ast.File, name string) []string {
	t.Helper()
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if id.Name != name || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.CompositeLit)
				if !ok {
					t.Fatalf("var %s is not a map literal", name)
				}
				var keys []string
				for _, elt := range lit.Elts {
					kv := elt.(*ast.KeyValueExpr)
					bl, ok := kv.Key.(*ast.BasicLit)
					if !ok {
						t.Fatalf("var %s: a key that is not a string literal", name)
					}
					s, err := strconv.Unquote(bl.Value)
					if err != nil {
						t.Fatal(err)
					}
					keys = append(keys, s)
				}
				return keys
			}
		}
	}
	t.Fatalf("no var %s", name)
	return nil
}

// TestAPIDocRoutes checks that api.md names every JSON route: every
// operation of the OpenAPI document, every verb and batch verb the server's
// router (server/http.go) accepts, and every fixed path it serves.
func TestAPIDocRoutes(t *testing.T) {
	doc := readAPIDoc(t)
	var want []string

	var oa struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openapi.Document(), &oa); err != nil {
		t.Fatal(err)
	}
	for path, ops := range oa.Paths {
		for method := range ops {
			switch method {
			case "get", "put", "post", "delete", "patch", "head":
				want = append(want, strings.ToUpper(method)+" "+path)
			}
		}
	}
	if len(want) < 15 {
		t.Fatalf("found %d operations in openapi.json: want every one of v1.2", len(want))
	}

	f := parseGoFile(t, "server/http.go")
	verbs := mapKeys(t, f, "verbs")
	batchVerbs := mapKeys(t, f, "batchVerbs")
	if len(verbs) < 6 || len(batchVerbs) < 2 {
		t.Fatalf("server/http.go: verbs %v, batch verbs %v: the parser missed some", verbs, batchVerbs)
	}
	for _, v := range verbs {
		want = append(want, "POST /v1/namespaces/{ns}/keys/{key}:"+v)
	}
	for _, v := range batchVerbs {
		want = append(want, "POST /v1/namespaces/{ns}/keys:"+v)
	}
	// The fixed paths the handler compares the raw path with.
	fixed := regexp.MustCompile(`^/[a-z0-9._-]+(/[a-z0-9._-]+)*$`)
	ast.Inspect(f, func(n ast.Node) bool {
		if bl, ok := n.(*ast.BasicLit); ok && bl.Kind == token.STRING {
			if s, err := strconv.Unquote(bl.Value); err == nil && fixed.MatchString(s) {
				want = append(want, "GET "+s)
			}
		}
		return true
	})
	want = append(want, "GET "+openapi.Path)

	slices.Sort(want)
	want = slices.Compact(want)
	for _, route := range want {
		if !strings.Contains(doc, "`"+route+"`") {
			t.Errorf("api.md does not name the route `%s`", route)
		}
	}
}

// TestAPIDocAnchors checks that every link to a section of api.md itself
// names a heading it has (GitHub's anchors: lower case, punctuation other
// than '-' and '_' dropped, spaces as '-').
func TestAPIDocAnchors(t *testing.T) {
	doc := readAPIDoc(t)
	anchors := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	links := regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(doc, -1)
	if len(links) < 10 {
		t.Fatalf("found %d links to sections: the pattern missed some", len(links))
	}
	for _, m := range links {
		if !anchors[m[1]] {
			t.Errorf("api.md links to #%s, which is no heading of it", m[1])
		}
	}
}

// kib spells a byte count the way api.md does: "64 KiB", "1 MiB".
func kib(n int) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// TestAPIDocLimits checks the rows of api.md's limits table against the
// constants that enforce them.
func TestAPIDocLimits(t *testing.T) {
	limits := section(t, readAPIDoc(t), "Limits and backpressure")
	rows := map[string][]string{
		"namespace":   {fmt.Sprintf("1-%d bytes", contract.MaxNamespaceBytes)},
		"key":         {fmt.Sprintf("1-%d bytes", contract.MaxKeyBytes)},
		"fingerprint": {fmt.Sprintf("0-%d characters", contract.MaxFingerprintChars)},
		"owner token": {fmt.Sprintf("%d-%d characters", contract.MinOwnerTokenChars, contract.MaxOwnerTokenChars)},
		"`lease_ms`":  {fmt.Sprintf("%d..%d, default %d", contract.MinLeaseMs, contract.MaxLeaseMs, contract.DefaultLeaseMs)},
		"`wait_ms`":   {fmt.Sprintf("0..%d", contract.MaxWaitMs)},
		"`retention_s`": {fmt.Sprintf("%d..%d, default %d", contract.MinRetentionS, contract.MaxRetentionS,
			contract.DefaultRetentionS)},
		"`tombstone_s`": {fmt.Sprintf("0..%d, default %d", contract.MaxTombstoneS, contract.DefaultTombstoneS)},
		"stored response body": {"default " + kib(contract.DefaultMaxResponseBytes),
			"at most " + kib(contract.MaxMaxResponseBytes)},
		"stored response headers": {fmt.Sprintf("%d headers", contract.MaxHeaders),
			fmt.Sprintf("names 1-%d bytes", contract.MaxHeaderNameBytes),
			"values " + kib(contract.MaxHeaderValueBytes), kib(contract.MaxHeadersTotalBytes) + " in all"},
		"response status":   {fmt.Sprintf("%d..%d", contract.MinStatus, contract.MaxStatus)},
		"checkpoint":        {"data " + kib(fsm.MaxCheckpointBytes)},
		"operator `reason`": {fmt.Sprintf("%d characters", server.MaxReasonChars)},
		"batch calls": {fmt.Sprintf("1-%d items", server.MaxBatchItems),
			fmt.Sprintf("%d operations, %s", idemv1.MaxBatchOps, kib(idemv1.MaxBatchBytes))},
		"key listing":     {fmt.Sprintf("`limit` 1..%d, default %d", backend.MaxListLimit, backend.DefaultListLimit)},
		"request headers": {kib(contract.MaxRequestHeaderBytes)},
	}
	for label, wants := range rows {
		_, row, ok := strings.Cut(limits, "\n| "+label+" | ")
		if !ok {
			t.Errorf("api.md, limits: no row %q", label)
			continue
		}
		row, _, _ = strings.Cut(row, "\n")
		for _, want := range wants {
			if !strings.Contains(row, want) {
				t.Errorf("api.md, limits, row %q: %q lacks %q", label, row, want)
			}
		}
	}
}
