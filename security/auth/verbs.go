package auth

import (
	"net/http"
	"net/url"
	"strings"
)

// Verb is what a request does, for authorization.
type Verb string

// The verbs of the contract. Namespace verbs need the namespace among the
// principal's; cluster verbs (the Admin service's Status, TransferLeader,
// Snapshot) act on no one namespace and need role admin with "*".
const (
	VerbGet          Verb = "get"           // reader
	VerbList         Verb = "list"          // reader
	VerbReserve      Verb = "reserve"       // writer
	VerbHeartbeat    Verb = "heartbeat"     // writer
	VerbComplete     Verb = "complete"      // writer
	VerbRelease      Verb = "release"       // writer
	VerbForceRelease Verb = "force-release" // admin, on its namespaces
	VerbDelete       Verb = "delete"        // admin, on its namespaces
	VerbCheckpoint   Verb = "checkpoint"    // writer
	VerbGetPolicy    Verb = "get-policy"    // reader
	VerbSetPolicy    Verb = "set-policy"    // admin, on its namespaces

	VerbStatus         Verb = "status"          // admin, "*"
	VerbTransferLeader Verb = "transfer-leader" // admin, "*"
	VerbSnapshot       Verb = "snapshot"        // admin, "*"
	// VerbTopology changes the cluster's shape (idemctl topology apply)
	// and covers the steps nodes ask each other for while it runs.
	VerbTopology Verb = "topology" // admin, "*"
	// VerbUnknown is a request the extractor could not classify; it fails
	// closed: role admin with "*".
	VerbUnknown Verb = "unknown"
	// VerbAuthenticate needs a known principal and nothing else: a request
	// that reaches no record (a malformed path the handler answers 400 or
	// 404).
	VerbAuthenticate Verb = "authenticate"
)

// MinRole is the least role that may use v.
func (v Verb) MinRole() Role {
	switch v {
	case VerbGet, VerbList, VerbGetPolicy, VerbAuthenticate:
		return RoleReader
	case VerbReserve, VerbHeartbeat, VerbComplete, VerbRelease, VerbCheckpoint:
		return RoleWriter
	}
	return RoleAdmin
}

// Cluster reports whether v acts on the whole cluster rather than a
// namespace.
func (v Verb) Cluster() bool {
	switch v {
	case VerbStatus, VerbTransferLeader, VerbSnapshot, VerbTopology, VerbUnknown:
		return true
	}
	return false
}

// Target is what a request asks to do: a verb on a namespace ("" for
// cluster verbs and VerbAuthenticate).
type Target struct {
	Namespace string
	Verb      Verb
}

// Probe paths need no credentials and reveal no record (contract: "/healthz,
// /readyz and /metrics need no credentials").
var probePaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true, "/openapi.json": true}

// consolePublic reports the operator console's paths a browser loads before
// it has a principal: the sign-in page and the console's script and styles,
// which reveal nothing. A path with ".." or an escape is never one (the
// console's mux would clean it into another page).
func consolePublic(raw string) bool {
	if strings.Contains(raw, "..") || strings.Contains(raw, "%") {
		return false
	}
	return raw == "/ui/login" || strings.HasPrefix(raw, "/ui/static/")
}

// JSONAPITarget classifies a request to the JSON API (docs/api.md): ok=false
// for the probes, which need no credentials; everything else needs a known
// principal. Paths it does not recognise under /v1/namespaces/{ns}/keys are
// VerbUnknown (fail closed); other unknown paths and invalid namespaces are
// VerbAuthenticate, so that the handler's 404 or 400 still reaches a known
// caller. A wiring whose router grows a new endpoint adds it here.
func JSONAPITarget(r *http.Request) (Target, bool) {
	raw := r.URL.EscapedPath()
	if probePaths[raw] || consolePublic(raw) {
		return Target{}, false
	}
	if raw == "/v1/topology" {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			return Target{Verb: VerbAuthenticate}, true // any known caller
		}
		return Target{Verb: VerbTopology}, true
	}
	rest, ok := strings.CutPrefix(raw, "/v1/namespaces/")
	if !ok {
		return Target{Verb: VerbAuthenticate}, true
	}
	nsRaw, rest, _ := strings.Cut(rest, "/")
	ns, err := url.PathUnescape(nsRaw)
	if err != nil || !validNamespace(ns) {
		return Target{Verb: VerbAuthenticate}, true
	}
	switch {
	case rest == "keys:batch-reserve" && r.Method == http.MethodPost:
		return Target{ns, VerbReserve}, true
	case rest == "keys:batch-complete" && r.Method == http.MethodPost:
		return Target{ns, VerbComplete}, true
	case rest == "policy":
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			return Target{ns, VerbGetPolicy}, true
		case http.MethodPut:
			return Target{ns, VerbSetPolicy}, true
		}
		return Target{ns, VerbUnknown}, true
	case rest == "keys":
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			return Target{ns, VerbList}, true
		}
		return Target{ns, VerbUnknown}, true
	case strings.HasPrefix(rest, "keys/") && len(rest) > len("keys/"):
		key := rest[len("keys/"):]
		if strings.Contains(key, "/") {
			return Target{Verb: VerbAuthenticate}, true // no such path: 404
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			return Target{ns, VerbGet}, true
		case http.MethodDelete:
			return Target{ns, VerbDelete}, true
		case http.MethodPost:
			i := strings.LastIndexByte(key, ':')
			if i < 0 {
				return Target{ns, VerbUnknown}, true
			}
			switch Verb(key[i+1:]) {
			case VerbReserve, VerbHeartbeat, VerbComplete, VerbRelease, VerbForceRelease, VerbCheckpoint:
				return Target{ns, Verb(key[i+1:])}, true
			}
		}
		return Target{ns, VerbUnknown}, true
	}
	return Target{Verb: VerbAuthenticate}, true
}

// GRPCTarget classifies an RPC of the idem.v1 services by its full method
// name and request (whose GetNamespace names the namespace). An RPC it does
// not know is VerbUnknown: it fails closed (admin, "*") until added here.
func GRPCTarget(fullMethod string, req any) Target {
	service, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	ns := ""
	if n, ok := req.(interface{ GetNamespace() string }); ok {
		ns = n.GetNamespace()
	}
	nsVerb := func(v Verb) Target {
		if !validNamespace(ns) {
			return Target{Verb: VerbAuthenticate} // the handler answers INVALID_ARGUMENT
		}
		return Target{ns, v}
	}
	switch service {
	case "idem.v1.Idempotency":
		switch method {
		case "Reserve":
			return nsVerb(VerbReserve)
		case "Heartbeat":
			return nsVerb(VerbHeartbeat)
		case "Complete":
			return nsVerb(VerbComplete)
		case "Release":
			return nsVerb(VerbRelease)
		case "Get":
			return nsVerb(VerbGet)
		case "Checkpoint":
			return nsVerb(VerbCheckpoint)
		case "Routing":
			// The ring and the nodes' addresses, for clients that send each
			// call to its shard's leader: any known principal (it reveals
			// the topology, never a record).
			return Target{Verb: VerbAuthenticate}
		case "BatchReserve":
			// v1.2 batch calls are of one namespace: the verb of their items.
			return nsVerb(VerbReserve)
		case "BatchComplete":
			return nsVerb(VerbComplete)
		case "Batch":
			// The batch itself needs a known principal; the unary
			// interceptor then authorizes each operation as its own RPC.
			return Target{Verb: VerbAuthenticate}
		}
	case "idem.v1.Topology":
		if method == "Get" {
			return Target{Verb: VerbAuthenticate}
		}
		return Target{Verb: VerbTopology}
	case "idem.v1.Admin":
		switch method {
		case "Status":
			return Target{Verb: VerbStatus}
		case "TransferLeader":
			return Target{Verb: VerbTransferLeader}
		case "Snapshot":
			return Target{Verb: VerbSnapshot}
		case "ListKeys":
			return nsVerb(VerbList)
		case "ListShard":
			// One shard's page of a ListKeys, forwarded by the node or router
			// that serves the listing with the caller's principal: the same
			// reader right.
			return nsVerb(VerbList)
		case "ForceRelease":
			return nsVerb(VerbForceRelease)
		case "DeleteKey", "Delete":
			return nsVerb(VerbDelete)
		case "GetPolicy":
			return nsVerb(VerbGetPolicy)
		case "SetPolicy", "SetShardPolicy":
			// SetShardPolicy is one shard's part of a SetPolicy, forwarded
			// with the caller's principal: the same admin right.
			return nsVerb(VerbSetPolicy)
		}
	}
	return Target{Verb: VerbUnknown}
}
