// Package archrules holds no code: its test, archrules_test.go, checks the
// dependency rules of ARCHITECTURE.md against the module's import graph as
// `go list -deps` reports it, so that a change that points an import the
// wrong way fails `go test` with the chain of imports that breaks the rule.
//
// The rules, with the reason for each:
//
//   - contract imports only the standard library, and fsm only it and
//     keyspace (whose one dependency is xxhash): the contract and the state
//     machine are pure and deterministic, and every process links them.
//   - topology imports of idem only contract and keyspace: the Go client
//     and idemctl link it to locate keys.
//   - raftstore imports of idem only the leaves internal/durable (the
//     fsync-a-directory rule, shared with node and internal/datadir) and
//     security/pki (a node's identity from its certificate, the rule of the
//     security tree); both leaves import nothing of idem. Raft storage thus
//     never reaches the API, the state machine or the serving code.
//   - client and cmd/idemctl link no server, node, fsm, backend,
//     raftstore, statedb, router, proxy, forward, internal/wire and no
//     Prometheus: a program that uses the Go client links the client only.
//   - node links no router, proxy or httpidem: a storage node forwards with
//     package forward and links no HTTP proxy engine.
//   - nothing imports cmd/*; only cmd/regionsim and regionsim's own
//     packages import regionsim.
//   - only the serving packages import server: node, router, client/idemtest
//     and the mains of idemnode and idemrouter.
//   - the test harnesses (internal/cluster, internal/testutil,
//     api/openapi/openapitest) are imported by tests only, so no binary
//     links them.
//   - internal/cli, the commands' kit (flag help, logging, profiling,
//     re-exec), is imported by cmd/* only.
package archrules
