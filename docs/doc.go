// Package docs holds the user documentation and the tests that keep it true.
//
// # Transcripts
//
// TestTranscripts runs the console blocks of README.md and docs/*.md (one
// subtest per file that has any) and compares what each command prints with
// what the page shows, so a walkthrough cannot drift from the product. A
// console block is a fenced code block whose info string is exactly
// "console"; blocks with any other info string (sh, bash, text, yaml) are
// not run. In a console block:
//
//   - A line starting with "$ " is a command, run by bash. A line ending in a
//     backslash continues on the next line, and a command with a
//     here-document (<<EOF, <<'EOF', <<-EOF) continues to its terminator line.
//   - Every other line is expected output of the command before it: stdout
//     and stderr merged, trailing blank lines ignored.
//   - A command ending in " &" is a long-running process (a node, a router).
//     Its output goes to a log; the lines shown under it must appear in that
//     log in order (whole lines, after normalisation). It must still be
//     running when the file's last command ends; then its process group gets
//     SIGTERM, and the runner waits for it to exit (a node drains and lets go
//     of its ports before the next file needs them), with SIGKILL after 10 s. A data race it reports, in its own
//     output or in a *.log file the commands wrote in the working directory,
//     fails the file; when a file fails, the last lines of those logs are
//     shown with the failure.
//
// All commands of one file run in order in one temporary directory, which
// holds a symlink to each top-level entry of the repository (so a page may
// name deploy/examples/three-node.yaml) and receives whatever the commands
// write (data dirs, logs). Variables, functions and the working directory
// carry over from one command to the next. The binaries of cmd/ that the
// file's commands name are built once (with -race when the test runs with
// it) and come first on PATH; "go run ./cmd/X" runs as the built X. bash runs
// with pipefail; each command has 60 s; a command that times out stops the
// file. A command that exits non-zero and prints nothing fails the file
// (a page may show a failing command together with its error message).
//
// Before a file runs, every loopback port it uses must be free: the ports
// named in its commands (127.0.0.1:N, localhost:N, [::1]:N, 0.0.0.0:N) or in
// the repository files they name (a topology file), and a dev node's default
// ports when it starts idemnode --dev (read from idemnode --help). The file
// first reserves them against the other test processes of the run that start
// examples on fixed ports (deploy's scripts), waiting its turn; then a port
// it cannot listen on fails the file, naming the port and the command that
// needs it, since a transcript talking to someone else's process would fail
// in confusing ways.
//
// Expected and actual output are compared line by line after these rules,
// applied to both:
//
//   - trailing spaces and tabs are dropped;
//   - a UUID (8-4-4-4-12 hex digits, any case) reads as <uuid>;
//   - an RFC 3339 time (2026-12-04T10:23:32.5Z, with or without fraction
//     and offset) reads as <time>;
//   - a generated owner token (22 characters of [A-Za-z0-9_-]) after
//     "owner_token":", owner_token= or owner= reads as <owner-token>;
//   - a Go duration (12.3ms, 1.5s, 2m3s, 45µs) reads as <duration>;
//   - two or more spaces after text read as two (a table's columns are as
//     wide as their widest value, often a volatile one); indentation stays;
//   - in an expected line, ... matches any text on that line (a large count
//     the page does not promise: fencing_token=...), and a line that is only
//     ... matches any number of lines, none included.
//
// Everything else must match exactly.
//
// After a deliberate change, rewrite the expected output from a real run and
// review the diff:
//
//	go test ./docs -run TestTranscripts -rewrite
//
// It replaces the output lines of every command that did not match with what
// the command printed, leaving commands, prose and matching output (with
// their ... patterns) as they were; the output shown under a background
// command is never rewritten.
//
// The transcripts start real processes, so they skip under go test -short;
// the parser, normaliser, matcher, rewriter and runner have their own fast
// tests (testdata/runner.md uses every rule above).
package docs
