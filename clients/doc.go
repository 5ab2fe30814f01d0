// Package clients holds idem's clients for other languages and the Go test
// that runs their test suites against a real node:
//
//   - typescript: @idem/client, the JSON API client, run/once and Express
//     middleware (tests: node --test);
//   - python: idem-client, the same for Python with asyncio and ASGI
//     middleware (tests: pytest).
//
// The test builds cmd/idemnode and cmd/idemctl into a temporary directory and
// hands their paths to each suite in IDEM_NODE_BIN and IDEM_CTL_BIN; each
// suite starts its own `idemnode --dev` nodes on free loopback ports (one of
// them secure, with certificates made by idemctl). Under CI=true a missing runtime or test dependency
// fails the test; elsewhere it is skipped with the command that installs it.
// It has no Go API.
package clients
