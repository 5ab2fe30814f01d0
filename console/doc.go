// Package console is the operator console: HTML pages served at /ui/ on the
// JSON API port of every idemnode and idemrouter, for an operator who wants
// to see one key, the work that is stuck, the cluster and a topology change
// in progress, the namespaces' policies and the traffic, without knowing the
// CLI or reading JSON.
//
// # Use
//
//	cfg := console.DefaultConfig()
//	cfg.API = apiHandler       // the JSON API as the listener serves it, with authentication
//	cfg.Registry = registry    // the process's metrics, for the traffic charts
//	cfg.Locate = locate        // a key's shard, home region, partition and leader
//	cfg.Cluster = clusterView  // a node's view of the cluster; nil on a router
//	c, err := console.New(cfg)
//	// serve c.Handler() for "/ui/" behind the same authentication as the
//	// API, and wrap what the listener serves in console.Sessions
//	defer c.Close()
//
// # What it guarantees
//
// The console reads and acts only through the JSON API: every page asks
// Config.API with the credentials of the browser's request (its client
// certificate and Authorization header), so the API's authentication,
// authorization, rate limits, validation and audit log apply unchanged. A
// force-release from the console is the API's force-release (logged as an
// "operator action" and counted in idem_operator_actions_total); a policy
// edit is the API's PUT of the policy, and a refusal shows the API's
// message. Pages list only the namespaces the principal may read: those its
// grants name and those this process served (idem_api_namespace_requests_total)
// that its grants cover, plus one the operator types.
//
// A browser cannot send a bearer token by itself: /ui/login checks one
// against the API and keeps it in an HttpOnly, SameSite=Strict cookie for
// /ui/ only, which Sessions (mounted in front of the API's authentication)
// turns back into the Authorization header; a client certificate needs no
// sign-in.
//
// Actions are POSTs with a CSRF token (an HMAC of the principal's name under
// a key made at start) and are refused unless the request is same-origin
// (Origin, else Referer, and Sec-Fetch-Site when sent). Every answer
// carries a strict Content-Security-Policy (scripts and styles from /ui/
// only, no inline script), X-Frame-Options: DENY and Cache-Control:
// no-store. Stored response bodies are shown escaped (text) or as hex
// (binary), never as markup.
//
// Pages, each at a URL that can be pasted in an incident channel:
//
//	/ui/keys/{namespace}/{key}   the key inspector (and /ui/keys, the search box)
//	/ui/stuck                    keys IN_PROGRESS longer than a threshold; /ui/stuck.json exports them
//	/ui/cluster                  regions, nodes, shards, a running topology change (live)
//	/ui/namespaces               policies and record counts; admins edit a policy
//	/ui/traffic                  outcomes per second per namespace and latency quantiles
//
// The traffic charts come from an in-process ring of samples of the
// process's own registry (one every Config.SampleEvery, Config.Samples
// kept), started by the first console request and stopped by Close: no
// Prometheus server is needed.
package console
