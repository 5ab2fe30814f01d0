package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/cli"
	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/security/pki"
	"github.com/idem-dev/idem/topology"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "v0.1.0-dev"

func main() { cli.Main("idemctl", run) }

// globals are the flags every command takes, before or after its name.
type globals struct {
	config   string
	json     bool
	timeout  time.Duration
	certsDir string
	user     string
	token    string
}

// defaultGlobals are the global flags' defaults.
func defaultGlobals() globals { return globals{timeout: 5 * time.Second, user: "root"} }

// register registers the global flags on fs, their defaults what g holds.
func (g *globals) register(fs *flag.FlagSet) {
	flags := []flagdoc.Flag{
		{Name: "config", Value: &g.config, Usage: "cluster topology `FILE` (YAML or JSON), the same file as the nodes'"},
		{Name: "json", Value: &g.json, Usage: "print JSON for scripts instead of tables"},
		{Name: "timeout", Value: &g.timeout, Usage: "deadline `D` for each call to a node"},
		{Name: "user", Value: &g.user, Usage: "secure cluster: the principal `NAME` whose client certificate to present (with --certs-dir; not with --token)"},
		{Name: "token", Value: &g.token, Usage: "secure cluster: authenticate with bearer `TOKEN` instead of a client certificate (the server is verified against --certs-dir's ca.crt, else the system's CAs)"},
	}
	if fs.Lookup("certs-dir") == nil { // idemctl cert has its own (the dir it writes)
		flags = append(flags, flagdoc.Flag{Name: "certs-dir", Value: &g.certsDir, Usage: "secure cluster: `DIR` with ca.crt and client.NAME.crt/.key of --user (idemctl cert create-client)"})
	}
	flagdoc.Register(fs, flags)
}

// command is one subcommand.
type command struct {
	name    string
	args    string // usage of the positional arguments
	extra   string // usage of the command's own flags
	summary string
	about   string                             // longer help
	nargs   [2]int                             // min and max positional arguments
	flags   func(o *cmdOptions) []flagdoc.Flag // the command's own flags
	run     func(ctx context.Context, env *env, args []string) error
}

// cmdOptions holds the command-specific flags.
type cmdOptions struct {
	addr    string // get, keys
	node    string // snapshot
	id      string // replace-node
	dataDir string // replace-node
	keys    keysOptions
	dead    stringList // topology apply
	noWait  bool       // topology apply
	policy  policyOptions
}

// defaultCmdOptions are the command flags' defaults.
func defaultCmdOptions() cmdOptions { return cmdOptions{keys: keysOptions{limit: 100}} }

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

var commands = []*command{
	{
		name: "status", summary: "regions, nodes, shards, leaders, terms, commit/applied indexes, health",
		about: `Asks every node of the topology for its status (Admin.Status on its gRPC
address) and prints the nodes with their health (ready, not ready, or
unreachable) and, per shard, its leader and every replica's Raft state, term,
commit, applied and last log index and record count. APPLIED is the last
entry the state machine saw (a command or a configuration); entries it never
sees (a new leader's no-op, a read's barrier) keep COMMIT and LAST ahead of
it until the next write, which is no lag. It fails only when no node answers.`,
		run: runStatus,
	},
	{
		name: "locate", args: "NAMESPACE KEY", nargs: [2]int{2, 2},
		summary: "the key's shard, home region, voters and current leader",
		about: `Computes the key's shard and home region from the topology file, as every
node and router does, and asks the shard's voters which one leads it.`,
		run: runLocate,
	},
	{
		name: "get", args: "NAMESPACE KEY", nargs: [2]int{2, 2},
		extra:   "[--addr HOST:PORT]",
		summary: "read a key's record (never its owner token)",
		about: `Reads the key over the gRPC API: from --addr (a node's or a router's gRPC
address) when given, else from the nodes of the topology, the key's voters
first. Reads are linearizable. A key with no record is an error (exit 1).`,
		flags: func(o *cmdOptions) []flagdoc.Flag {
			return []flagdoc.Flag{{Name: "addr", Value: &o.addr, Usage: "gRPC `HOST:PORT` of the node or router to ask (default: the topology's nodes)"}}
		},
		run: runGet,
	},
	{
		name: "transfer-leader", args: "SHARD [TARGET_NODE]", nargs: [2]int{1, 2},
		summary: "move a shard's leadership to TARGET_NODE (or the voter Raft picks)",
		about: `Finds the shard's current leader and asks it to hand leadership to
TARGET_NODE, a voter of the shard (without it, Raft picks the most up-to-date
follower), then waits until a new leader is known.`,
		run: runTransferLeader,
	},
	{
		name: "snapshot", args: "SHARD", nargs: [2]int{1, 1},
		extra:   "[--node ID]",
		summary: "force a Raft snapshot of a shard (on its leader, or on --node)",
		about: `Makes one replica of the shard take a Raft snapshot now, which also lets it
truncate its log: the current leader by default, or the voter --node.`,
		flags: func(o *cmdOptions) []flagdoc.Flag {
			return []flagdoc.Flag{{Name: "node", Value: &o.node, Usage: "the voter `ID` that takes the snapshot (default: the shard's leader)"}}
		},
		run: runSnapshot,
	},
	{
		name: "keys", args: "list NAMESPACE | force-release NAMESPACE KEY | delete NAMESPACE KEY", nargs: [2]int{2, 3},
		extra:   "[--state S] [--older-than D] [--limit N] [--reason TEXT] [--addr HOST:PORT]",
		summary: "list a namespace's keys; force-release a stuck key; delete a record",
		about: `The operator actions on keys, over the gRPC Admin service of --addr (a node
or router) or else of the first node of the topology that answers:

  keys list NAMESPACE [--state IN_PROGRESS|COMPLETED] [--older-than D] [--limit N]
      the namespace's keys across every shard, in pages (at most --limit in
      all; --page-token continues); --older-than selects keys whose current
      owner reserved them at least D ago.
  keys force-release NAMESPACE KEY --reason TEXT
      takes an IN_PROGRESS key from its owner (a COMPLETED one is refused):
      the owner gets NOT_OWNER from then on and the next reserve RECLAIMED,
      with the old fencing token as previous_fencing_token.
  keys delete NAMESPACE KEY --reason TEXT
      removes the record in any state; the next reserve gets ACQUIRED.

Fencing tokens stay strictly increasing through both. Each action is logged by
the node with the principal, the key and the reason.`,
		flags: keysFlags,
		run:   runKeys,
	},
	{
		name: "namespaces", args: "set-policy NAMESPACE | get-policy NAMESPACE", nargs: [2]int{2, 2},
		extra:   "[--default-lease-ms N] [--max-lease-ms N] [--default-retention-s N] [--max-retention-s N] [--tombstone-s N] [--addr HOST:PORT]",
		summary: "set or read a namespace's policy: lease and retention defaults and maxima, tombstones",
		about: `A namespace's policy, over the gRPC Admin service of --addr (a node or
router) or else of the first node of the topology that answers:

  namespaces set-policy NAMESPACE [--default-lease-ms N] [--max-lease-ms N]
      [--default-retention-s N] [--max-retention-s N] [--tombstone-s N]
      replaces the namespace's policy (role admin on it): a flag not given takes
      the built-in default (lease 30000 ms, at most 600000; retention
      86400 s, at most 2592000; tombstones 604800 s, 0 keeps none). It is
      in force for every request accepted after the command returns: a
      reserve, heartbeat or complete asking for more than a max gets 400
      INVALID_ARGUMENT naming the limit. Prints the policy in force.
  namespaces get-policy NAMESPACE
      the policy in force (role reader), every field filled in.`,
		flags: namespacesFlags,
		run:   runNamespaces,
	},
	{
		name: "topology", args: "plan FILE | apply FILE | status", nargs: [2]int{1, 2},
		extra:   "[--dead NODE]... [--no-wait] [--addr HOST:PORT]",
		summary: "change the running cluster's shape: plan, apply and follow a new topology file",
		about: `Changes the cluster's shape online (nodes joining and leaving regions, a node
replaced by a new id, replicas, survival, regions and shards_per_region,
whose changes move ring partitions and their keys between shards). The nodes
to ask are those of --config, else those of FILE, else --addr.

  topology plan FILE
      compares FILE (version: active + 1) with the cluster's active topology
      and prints the nodes joining and leaving, per shard the voters added
      and removed, the seats moved against a lower bound, and the share of
      keys that move. Exits non-zero with every reason when the change cannot
      be applied (a changed cluster name or ring section, a wrong version, a
      node that changes region).
  topology apply FILE [--dead NODE]... [--no-wait]
      stores FILE as the cluster's target (role admin on "*") and follows
      the change to the end: each shard gains its new voters as learners
      that catch up from a snapshot, promotes them, then drops the leaving
      ones (leadership handed over first). Safe to run again: it resumes.
      --dead names a leaving node that is down for good. Start a joining
      node (idemnode --config FILE --id NEW) before or after.
  topology status
      the active and target versions, shards done and left, and which
      removed nodes may be stopped.`,
		flags: func(o *cmdOptions) []flagdoc.Flag {
			return []flagdoc.Flag{
				{Name: "dead", Value: &o.dead, Usage: "a leaving `NODE` that is down for good (repeatable)"},
				{Name: "no-wait", Value: &o.noWait, Usage: "return once the target is stored"},
				{Name: "addr", Value: &o.addr, Usage: "gRPC `HOST:PORT` of the node to ask (default: the topology's nodes)"},
			}
		},
		run: runTopology,
	},
	{
		name: "replace-node", extra: "--id NODE [--data-dir DIR]",
		summary: "bring back a node whose data dir was lost, as a fresh replica",
		about: `For a node whose Raft state was lost or damaged (it refuses to start and
says to run this). The node must be stopped: replace-node refuses while its
Raft port answers or its log file is locked. It empties the node's data dir,
marks it to rejoin (its next start joins every shard empty instead of
refusing), and asks the leader of every shard the node votes in to remove it
and add it back (Admin.ReplaceVoter). Then start the node as before: it
catches up from its peers (by snapshot when the leaders compacted their log)
and becomes ready. Every shard of the node needs a live leader among the
other voters; if one has none, nothing is changed. Safe to run again after a
failure half-way.`,
		flags: func(o *cmdOptions) []flagdoc.Flag {
			return []flagdoc.Flag{
				{Name: "id", Value: &o.id, Usage: "the `NODE` id to bring back (required)"},
				{Name: "data-dir", Value: &o.dataDir, Usage: "the node's data `DIR` (default ./idem-data/<id>, as idemnode's)"},
			}
		},
		run: runReplaceNode,
	},
}

func (c *command) synopsis() string {
	return strings.Join(strings.Fields(c.name+" "+c.args+" "+c.extra), " ")
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func commandNames() string {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

const usageHeader = `idemctl: the operator's tool for idem, the multi-region idempotency-key store.

Usage:
  idemctl [--config FILE] [--json] [--timeout D] COMMAND [ARGS] [FLAGS]

Commands:
`

func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, usageHeader)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-37s %s\n", c.synopsis(), c.summary)
	}
	fmt.Fprint(w, "\nFlags (also accepted after the command):\n")
	flagdoc.PrintFlags(w, fs)
	fmt.Fprint(w, "\nRun \"idemctl COMMAND --help\" for a command's help. Tables are aligned for people;\n--json prints one JSON document for scripts. Any failure exits 1 with one line on stderr.\n")
}

func printCommandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage:\n  idemctl %s [--config FILE] [--json] [--timeout D]\n\n%s\n\nFlags:\n", c.synopsis(), c.about)
	flagdoc.PrintFlags(w, fs)
}

// env is what a command runs with.
type env struct {
	g      globals
	tls    *tls.Config // nil: plaintext
	o      cmdOptions
	topo   *topology.Topology // nil when --config was not given
	stdout io.Writer
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	g := defaultGlobals()
	fs := flag.NewFlagSet("idemctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g.register(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, fs)
			return nil
		}
		return err
	}
	if *showVersion {
		fmt.Fprintln(stdout, "idemctl", version)
		return nil
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("a command is required (%s; see --help)", commandNames())
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		if len(rest) > 0 {
			if c := findCommand(rest[0]); c != nil {
				opts := defaultCmdOptions()
				cfs := commandFlags(c, &g, &opts)
				printCommandUsage(stdout, c, cfs)
				return nil
			}
		}
		printUsage(stdout, fs)
		return nil
	}
	if name == certCommandName {
		if g.certsDir != "" { // given before the command name
			rest = append([]string{"--certs-dir", g.certsDir}, rest...)
		}
		return runCert(ctx, rest, stdout)
	}
	c := findCommand(name)
	if c == nil {
		return fmt.Errorf("unknown command %q (commands: %s; see --help)", name, commandNames())
	}
	e := &env{stdout: stdout, o: defaultCmdOptions()}
	cfs := commandFlags(c, &g, &e.o)
	positional, err := parseInterleaved(cfs, rest)
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(stdout, c, cfs)
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	if len(positional) < c.nargs[0] || len(positional) > c.nargs[1] {
		if c.args == "" {
			return fmt.Errorf("%s takes no arguments, got %q (see idemctl %s --help)", c.name, positional, c.name)
		}
		return fmt.Errorf("%s needs %s, got %d argument(s) (see idemctl %s --help)", c.name, c.args, len(positional), c.name)
	}
	if g.timeout <= 0 {
		return fmt.Errorf("--timeout must be positive, got %s", g.timeout)
	}
	e.g = g
	if e.tls, err = clientTLS(g); err != nil {
		return err
	}
	if g.config != "" {
		if e.topo, err = topology.LoadFile(g.config); err != nil {
			return err
		}
	}
	return c.run(ctx, e, positional)
}

func commandFlags(c *command, g *globals, o *cmdOptions) *flag.FlagSet {
	fs := flag.NewFlagSet("idemctl "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g.register(fs)
	if c.flags != nil {
		flagdoc.Register(fs, c.flags(o))
	}
	return fs
}

// parseInterleaved parses flags anywhere among the positional arguments
// ("locate ns key --json"); after "--" everything is positional, so a key
// that starts with "-" can be given.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		if len(rest) == 0 {
			return positional, nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// needTopology returns the topology or the error a command without one gets.
func (e *env) needTopology(what string) (*topology.Topology, error) {
	if e.topo == nil {
		return nil, fmt.Errorf("%s needs the topology: pass --config FILE", what)
	}
	return e.topo, nil
}

// clientTLS is the TLS config of --certs-dir, --user and --token: nil
// (plaintext) without either; with --certs-dir, its ca.crt and (without
// --token) the client certificate of --user; with --token alone, the
// system's CAs.
func clientTLS(g globals) (*tls.Config, error) {
	switch {
	case g.certsDir == "" && g.token == "":
		return nil, nil
	case g.certsDir == "":
		return &tls.Config{MinVersion: tls.VersionTLS12}, nil
	case g.token != "":
		return pki.ClientTLS(g.certsDir, "")
	}
	return pki.ClientTLS(g.certsDir, g.user)
}
