package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/api/openapi"
	"github.com/idem-dev/idem/api/openapi/openapitest"
)

// TestOpenAPIAgainstDevNode: a dev idemnode serves the committed OpenAPI
// document at /openapi.json, and its answers, including the node-only
// /v1/topology that package server's test cannot reach, conform to it.
func TestOpenAPIAgainstDevNode(t *testing.T) {
	addr, _ := startDev(t, nil)
	base := "http://" + addr
	v := openapitest.New(t)
	client := &http.Client{Timeout: 30 * time.Second}
	do := func(c openapitest.Call, status int) openapitest.Response {
		t.Helper()
		r := v.Do(t, client, base, c)
		if r.Status != status {
			t.Fatalf("%s %s: got %s, want %d", c.Method, c.Template, r, status)
		}
		return r
	}

	r := do(openapitest.Call{Method: "GET", Template: openapi.Path}, 200)
	if !bytes.Equal(r.Body, openapi.Document()) {
		t.Fatalf("GET /openapi.json is not the committed document (%d bytes)", len(r.Body))
	}
	r = do(openapitest.Call{Method: "GET", Template: "/v1/topology"}, 200)
	if r.JSON["active_version"] == nil {
		t.Fatalf("GET /v1/topology: %s", r)
	}
	do(openapitest.Call{Method: "PUT", Template: "/v1/topology", Body: `{"dead":[]}`}, 400)
	// A member named twice is refused, not decoded as the last one.
	r = do(openapitest.Call{Method: "PUT", Template: "/v1/topology", Body: `{"topology":"x","topology":"y","dead":[]}`}, 400)
	if e, _ := r.JSON["error"].(map[string]any); e["code"] != "INVALID_ARGUMENT" || !strings.Contains(e["message"].(string), `"topology" twice`) {
		t.Fatalf("PUT /v1/topology naming topology twice: %s", r)
	}
	do(openapitest.Call{Method: "DELETE", Template: "/v1/topology"}, 405)
	do(openapitest.Call{Method: "GET", Template: "/readyz"}, 200)
	do(openapitest.Call{Method: "GET", Template: "/healthz"}, 200)

	// A reserve, complete and replay through Raft.
	p := map[string]string{"ns": "openapi", "key": "order:1"}
	owner := "owner-token-00001"
	r = do(openapitest.Call{Method: "POST", Template: "/v1/namespaces/{ns}/keys/{key}:reserve", Params: p,
		Body: `{"fingerprint":"f","owner_token":"` + owner + `"}`}, 200)
	if r.JSON["outcome"] != "ACQUIRED" {
		t.Fatalf("reserve: %s", r)
	}
	do(openapitest.Call{Method: "POST", Template: "/v1/namespaces/{ns}/keys/{key}:complete", Params: p,
		Body: `{"owner_token":"` + owner + `","response":{"status":200,"headers":{"a":"b"},"body":"b2s="}}`}, 200)
	r = do(openapitest.Call{Method: "POST", Template: "/v1/namespaces/{ns}/keys/{key}:reserve", Params: p, Body: `{"fingerprint":"f"}`}, 200)
	if r.JSON["outcome"] != "COMPLETED" {
		t.Fatalf("replay: %s", r)
	}
	do(openapitest.Call{Method: "GET", Template: "/v1/namespaces/{ns}/keys/{key}", Params: p}, 200)
}
