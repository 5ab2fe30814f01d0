// Package openapi holds the OpenAPI 3.1 document of idem's JSON API
// (docs/api.md, "OpenAPI"), openapi.json, which every node and router
// serves at GET /openapi.json without credentials.
//
// The document is written by hand and kept honest by tests: package server's
// tests send every operation to a real in-process server and validate the
// requests and the responses against it with github.com/getkin/kin-openapi,
// which reads OpenAPI 3.1 and checks schemas as JSON Schema 2020-12 (see
// package openapitest). A change to a request or response of the API that
// the document does not describe fails those tests.
package openapi

import (
	_ "embed"
	"net/http"
	"strconv"
)

// Path is where nodes and routers serve the document.
const Path = "/openapi.json"

//go:embed openapi.json
var document []byte

// Document is the OpenAPI document, JSON. The caller must not modify it.
func Document() []byte { return document }

// ServeHTTP answers GET and HEAD with the document; the caller has checked
// the method.
func ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(document)))
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(document)
	}
}
