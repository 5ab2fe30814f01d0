// Package openapitest checks real HTTP exchanges with a node or router
// against the OpenAPI document of package openapi, for tests.
//
// It loads the document with github.com/getkin/kin-openapi, which reads
// OpenAPI 3.1 and validates schemas as JSON Schema 2020-12. Every response is
// validated against the operation's declared responses (an undeclared status
// fails); every request the server accepted (2xx, and no batch item refused
// as INVALID_ARGUMENT) is validated against the operation's parameters and
// request body, so the document cannot describe a request shape the server
// does not take. RequestError gives the document's verdict on a request
// without sending it, for tests that compare it with the server's. It records which operations a test
// exercised, so that a test can require all of them.
package openapitest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/idem-dev/idem/api/openapi"
)

// Validator validates exchanges against the document and records coverage.
type Validator struct {
	Doc *openapi3.T

	mu   sync.Mutex
	seen map[string][]int // "METHOD /template" -> statuses answered
}

// New loads and validates the document; a document kin-openapi refuses fails
// tb.
func New(tb testing.TB) *Validator {
	tb.Helper()
	doc, err := Load()
	if err != nil {
		tb.Fatalf("openapi.json: %v", err)
	}
	return &Validator{Doc: doc, seen: map[string][]int{}}
}

// Load parses and validates the embedded document.
func Load() (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openapi.Document())
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(loader.Context); err != nil {
		return nil, err
	}
	return doc, nil
}

// Operations lists every operation of the document as "METHOD /template",
// sorted.
func (v *Validator) Operations() []string {
	var ops []string
	for path, item := range v.Doc.Paths.Map() {
		for method := range item.Operations() {
			ops = append(ops, method+" "+path)
		}
	}
	sort.Strings(ops)
	return ops
}

// Statuses are the statuses an operation answered so far, in order.
func (v *Validator) Statuses(op string) []int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]int(nil), v.seen[op]...)
}

// Response is one answer, read whole.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// JSON is the body decoded when it is a JSON object, else nil.
	JSON map[string]any
}

// String is for failure messages.
func (r Response) String() string {
	return http.StatusText(r.Status) + " " + strings.TrimSpace(string(r.Body))
}

// Call is one request to send.
type Call struct {
	Method string
	// Template is the document's path, e.g. /v1/namespaces/{ns}/keys/{key}:reserve.
	Template string
	// Params fills the template's parameters (percent-encoded when sent).
	Params map[string]string
	Query  url.Values
	Body   string
	Header http.Header
}

// request builds c's request to base; its body is unread.
func (c Call) request(tb testing.TB, ctx context.Context, base string) *http.Request {
	tb.Helper()
	path := c.Template
	for name, value := range c.Params {
		path = strings.ReplaceAll(path, "{"+name+"}", url.PathEscape(value))
	}
	u := base + path
	if len(c.Query) > 0 {
		u += "?" + c.Query.Encode()
	}
	var body io.Reader
	if c.Body != "" {
		body = strings.NewReader(c.Body)
	}
	req, err := http.NewRequestWithContext(ctx, c.Method, u, body)
	if err != nil {
		tb.Fatalf("%s %s: %v", c.Method, u, err)
	}
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	if c.Body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// Do sends c to base (e.g. http://127.0.0.1:8080) with client, validates the
// exchange and returns the answer. Validation failures fail tb.
func (v *Validator) Do(tb testing.TB, client *http.Client, base string, c Call) Response {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := c.request(tb, ctx, base)
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", c.Method, req.URL, err)
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		tb.Fatalf("%s %s: reading the answer: %v", c.Method, req.URL, err)
	}
	out := Response{Status: resp.StatusCode, Header: resp.Header, Body: data}
	var obj map[string]any
	if json.Unmarshal(data, &obj) == nil {
		out.JSON = obj
	}
	v.Check(tb, c.request(tb, ctx, base), c.Template, c.Params, out)
	return out
}

// RequestError is the document's verdict on c as a request of its
// operation: nil when the operation's parameters and request body schema
// accept it, else why not. Nothing is sent.
func (v *Validator) RequestError(tb testing.TB, c Call) error {
	tb.Helper()
	item := v.Doc.Paths.Value(c.Template)
	if item == nil || item.GetOperation(c.Method) == nil {
		tb.Fatalf("%s %s: not an operation of openapi.json", c.Method, c.Template)
	}
	return openapi3filter.ValidateRequest(context.Background(), v.requestInput(c.request(tb, context.Background(), "http://idem.invalid"), c.Template, c.Params))
}

func (v *Validator) requestInput(req *http.Request, template string, params map[string]string) *openapi3filter.RequestValidationInput {
	item := v.Doc.Paths.Value(template)
	route := &routers.Route{Spec: v.Doc, Path: template, PathItem: item, Method: req.Method, Operation: item.GetOperation(req.Method)}
	return &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			MultiError:         true,
		},
	}
}

// Check validates one exchange of the operation (req.Method, template): the
// answer always, the request when the answer is 2xx. req's body, if any, must
// be unread.
func (v *Validator) Check(tb testing.TB, req *http.Request, template string, params map[string]string, resp Response) {
	tb.Helper()
	op := req.Method + " " + template
	item := v.Doc.Paths.Value(template)
	if item == nil {
		tb.Fatalf("%s: not a path of openapi.json", op)
	}
	if item.GetOperation(req.Method) == nil {
		// A method the path does not have: 405 with the error body.
		v.checkMethodNotAllowed(tb, op, resp)
		return
	}
	v.mu.Lock()
	v.seen[op] = append(v.seen[op], resp.Status)
	v.mu.Unlock()
	in := v.requestInput(req, template, params)
	ctx := context.Background()
	if resp.Status >= 200 && resp.Status < 300 && !ItemRefused(resp) {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			tb.Errorf("%s: the server accepted a request openapi.json does not describe: %v", op, err)
		}
	}
	rin := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 resp.Status,
		Header:                 resp.Header,
		Body:                   io.NopCloser(bytes.NewReader(resp.Body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(ctx, rin); err != nil {
		tb.Errorf("%s: the answer %d does not conform to openapi.json: %v\nbody: %s", op, resp.Status, err, truncate(resp.Body, 2048))
	}
}

// ItemRefused reports whether resp is a batch call's answer with an item
// refused as INVALID_ARGUMENT: the call was answered 200, but the request
// as a whole was not accepted, as the document's schema would not accept it.
func ItemRefused(resp Response) bool {
	results, _ := resp.JSON["results"].([]any)
	for _, r := range results {
		item, _ := r.(map[string]any)
		e, _ := item["error"].(map[string]any)
		if e["code"] == "INVALID_ARGUMENT" {
			return true
		}
	}
	return false
}

func (v *Validator) checkMethodNotAllowed(tb testing.TB, op string, resp Response) {
	tb.Helper()
	if resp.Status != http.StatusMethodNotAllowed || resp.Header.Get("Allow") == "" {
		tb.Errorf("%s: a method openapi.json does not list answered %d (Allow %q), want 405 with Allow", op, resp.Status, resp.Header.Get("Allow"))
		return
	}
	var body any
	if err := json.Unmarshal(resp.Body, &body); err != nil {
		tb.Errorf("%s: 405 body is not JSON: %v", op, err)
		return
	}
	if err := v.Doc.Components.Schemas["Error"].Value.VisitJSON(body, openapi3.EnableJSONSchema2020()); err != nil {
		tb.Errorf("%s: 405 body does not conform to openapi.json's Error: %v", op, err)
	}
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
