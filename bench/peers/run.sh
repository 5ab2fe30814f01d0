#!/usr/bin/env bash
# The peer benchmark in one command (README.md, "Performance"): builds it and
# runs it; flags pass through, e.g.  bench/peers/run.sh --duration 2s --rounds 1
# It builds first and then runs the binary (rather than `go run`), so Ctrl-C
# and SIGTERM reach the benchmark itself, which stops every server it started.
set -euo pipefail
cd "$(dirname "$0")"
bin="${TMPDIR:-/tmp}/idem-peers-bench"
go build -o "$bin" .
exec "$bin" "$@"
