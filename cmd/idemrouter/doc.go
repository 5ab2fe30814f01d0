// Command idemrouter is idem's stateless edge router. It serves the same
// JSON and gRPC API as a storage node (docs/api.md) and forwards each request
// to the leader of its key's shard; it holds no data, so any number of
// routers can run per region and be restarted at will.
//
//	idemrouter --config cluster.yaml --region us-east
//	idemrouter --config cluster.yaml --region eu-west --http-addr 0.0.0.0:8090 --grpc-addr 0.0.0.0:7090 \
//	    --certs-dir certs/router --auth-file auth.yaml
//
// # Flags
//
//	--config FILE          the topology file, the same as the nodes' (required)
//	--region NAME          the region this router runs in (required; must be in FILE)
//	--http-addr HOST:PORT  JSON API, /metrics, /healthz, /readyz (default 127.0.0.1:8090)
//	--grpc-addr HOST:PORT  gRPC API (default 127.0.0.1:7090)
//	--request-timeout D    deadline for one forwarded request (default 5s), plus a
//	                       second per MiB of response or checkpoint it carries
//	--max-response-bytes N largest stored response body (default 1048576); not in the
//	                       contract's table: set it as on the nodes so the router
//	                       accepts and relays what they store
//	--log-level LEVEL      debug, info, warn or error (default info)
//	--log-format FORMAT    text or json (default text)
//	--certs-dir DIR        secure mode: ca.crt, node.crt, node.key (TLS on every listener,
//	                       mTLS to the nodes); without it, non-loopback listen addresses
//	                       refuse to start unless --insecure
//	--auth-file FILE       principals, namespaces, roles, rates (reloaded on SIGHUP)
//	--insecure             allow plaintext beyond loopback
//	--max-conns N          connections per listener (default 4096)
//	--http-read-timeout D, --http-write-timeout D, --http-idle-timeout D (30s, 60s, 120s)
//	--proxy-key-file FILE  proxy mode: key of the Authorization hash (default proxy.key in
//	                       --certs-dir, else random per process)
//	--help, --version
//
// A bad flag or topology exits 1 with one line on stderr. On SIGTERM (or
// Ctrl-C) the router stops accepting, lets in-flight requests finish and
// exits 0, within 15 s.
//
// # How a request is routed
//
// Every router computes key -> shard -> home region -> voters from the
// topology file alone (package topology's Ring), then forwards over gRPC to
// the shard's leader. It keeps a leader cache fed by the idem-leader header
// that nodes put on their answers, tries the shard's other voters when the
// cached leader fails (dropping it from the cache), and marks each forwarded
// request with an idem-hops count so that a stale hint can never make a
// request circle between nodes.
//
// Retries never apply a command twice: the router fills in a reserve's owner
// token before forwarding (generating one when the client sent none), so a
// reserve retried after a lost answer comes back as the same reservation
// (ACQUIRED with the same owner and fencing token) or as IN_PROGRESS, never
// as a second ACQUIRED; heartbeat and complete are idempotent for the same
// owner token; and a release whose retry answers NOT_OWNER after an
// ambiguous first attempt is reported as UNAVAILABLE (outcome unknown)
// rather than as a false NOT_OWNER.
//
// # Unavailability and readiness
//
// When the key's shard cannot be reached within --request-timeout (the home
// region is lost under survival: zone, the shard has no leader, the network
// swallows requests), the answer is 503 UNAVAILABLE with Retry-After (gRPC
// UNAVAILABLE with a RetryInfo), and nothing else: the router never guesses
// an answer for a region it cannot reach. Refused connections are detected
// at once, so keys of a lost region fail fast rather than at the deadline.
// As the contract says for UNAVAILABLE, the client retries with the same
// owner token.
//
// /readyz answers 200 once the topology is loaded and a gRPC connection to
// at least one node is up; the router watches a connection to every node in
// the background, so /readyz never waits on the network. It stays ready
// while a remote region is lost (those keys get 503).
//
// # Metrics
//
// Besides the API's idem_api_* series and the Go runtime's:
//
//	idem_forward_requests_total{region,outcome}       forwarded attempts by destination region and outcome
//	idem_forward_duration_seconds{region}             latency of one forwarded attempt
//	idem_forward_leader_cache_misses_total            attempts that did not go to a cached leader first
//	idem_router_request_duration_seconds{region,outcome}  whole requests by home region, retries included
//	idem_router_unavailable_total{region}             503 answers by the key's home region
//	idem_router_reachable_nodes{region}               nodes with a ready connection, by region
//
// # Proxy mode
//
// With --upstream the router also runs as an idempotency proxy in front of
// an HTTP API (see docs/api.md, "Proxy mode"), over the same in-process
// backend, served and drained with the API.
//
// # Layout
//
// This command only maps flags onto a router.ProcessConfig; the process
// itself (backend, ring check, listeners, proxy mode, drain) is
// router.Process, and its graceful stop is internal/serving, shared with
// idemnode.
package main
