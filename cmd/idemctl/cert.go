package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/idem-dev/idem/internal/flagdoc"
	"github.com/idem-dev/idem/security/pki"
)

// certCommandName is dispatched by run before the generic command path: cert
// has subcommands and flags of its own and talks to no node.
const certCommandName = "cert"

// certSub is one "idemctl cert" subcommand.
type certSub struct {
	name, args, summary string
	nargs               [2]int // min and max positional arguments (-1: no max)
	needsID             bool
	run                 func(o *certOptions, args []string) ([]string, error) // returns the files written
}

type certOptions struct {
	dir      string
	id       string
	caKey    string
	lifetime time.Duration
}

var certSubs = []certSub{
	{
		name: "create-ca", summary: "a new CA: ca.crt and ca.key (refuses to overwrite an existing CA)",
		run: func(o *certOptions, _ []string) ([]string, error) {
			return []string{pki.CACertFile, pki.CAKeyFile}, pki.CreateCA(o.dir, pki.Options{Lifetime: o.lifetime})
		},
	},
	{
		name: "create-node", args: "HOST...", nargs: [2]int{1, -1}, needsID: true,
		summary: "node.crt and node.key for node --id, valid for each HOST (DNS name or IP), server and client",
		run: func(o *certOptions, hosts []string) ([]string, error) {
			return []string{pki.NodeCertFile, pki.NodeKeyFile}, pki.CreateNode(o.dir, o.caKey, o.id, hosts, pki.Options{Lifetime: o.lifetime})
		},
	},
	{
		name: "create-router", args: "HOST...", nargs: [2]int{1, -1}, needsID: true,
		summary: "router.crt and router.key for router --id, valid for each HOST; taken by nodes as a forwarding peer, never on the Raft port",
		run: func(o *certOptions, hosts []string) ([]string, error) {
			return []string{pki.RouterCertFile, pki.RouterKeyFile}, pki.CreateRouter(o.dir, o.caKey, o.id, hosts, pki.Options{Lifetime: o.lifetime})
		},
	},
	{
		name: "create-client", args: "NAME", nargs: [2]int{1, 1},
		summary: "client.NAME.crt and client.NAME.key: a client certificate for principal NAME",
		run: func(o *certOptions, args []string) ([]string, error) {
			return []string{pki.ClientCertFile(args[0]), pki.ClientKeyFile(args[0])},
				pki.CreateClient(o.dir, o.caKey, args[0], pki.Options{Lifetime: o.lifetime})
		},
	},
}

const certAbout = `Makes the certificates of a secure cluster (ECDSA P-256, PEM, keys mode 0600).
create-node, create-router and create-client sign with DIR/ca.crt and
DIR/ca.key, or with --ca-key FILE when the CA key is kept elsewhere. A certs
dir holds one node's or router's certificate: make one dir per process, each
with a copy of ca.crt, or move node.crt and node.key away before the next
create-node. A router's certificate opens no Raft port. No file is ever
overwritten.

  idemctl cert create-ca --certs-dir certs
  idemctl cert create-node --certs-dir certs --id us-east-1 127.0.0.1 node1.internal
  idemctl cert create-router --certs-dir router-certs --id edge-1 router1.internal
  idemctl cert create-client --certs-dir certs root`

func init() {
	// Listed in the global help like any command; run dispatches it to runCert.
	commands = append(commands, &command{
		name: certCommandName, args: "create-ca|create-node|create-router|create-client", extra: "--certs-dir DIR",
		summary: "make the CA, node, router and client certificates of a secure cluster",
		about:   certAbout,
		flags:   func(*cmdOptions) []flagdoc.Flag { return (&certOptions{}).flags() },
		run:     func(ctx context.Context, e *env, args []string) error { return runCert(ctx, args, e.stdout) },
	})
}

// flags are the flags of idemctl cert, their defaults what o holds.
func (o *certOptions) flags() []flagdoc.Flag {
	return []flagdoc.Flag{
		{Name: "certs-dir", Value: &o.dir, Usage: "the certs `DIR` to write into (created if missing); required"},
		{Name: "id", Value: &o.id, Usage: "create-node: the node `ID` of the topology the certificate is for; create-router: the router's name; required"},
		{Name: "ca-key", Value: &o.caKey, Usage: "the CA key `FILE` that signs (default: DIR/ca.key)"},
		{Name: "lifetime", Value: &o.lifetime, Usage: "validity `D` from now (default: 87600h for a CA, 17520h for a node, router or client; never past the CA's)"},
	}
}

func findCertSub(name string) *certSub {
	for i := range certSubs {
		if certSubs[i].name == name {
			return &certSubs[i]
		}
	}
	return nil
}

func certUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, "Usage:\n")
	for _, s := range certSubs {
		syn := strings.Join(strings.Fields("idemctl cert "+s.name+" --certs-dir DIR "+map[bool]string{true: "--id ID "}[s.needsID]+s.args), " ")
		fmt.Fprintf(w, "  %-72s\n      %s\n", syn, s.summary)
	}
	fmt.Fprintf(w, "\n%s\n\nFlags:\n", certAbout)
	flagdoc.PrintFlags(w, fs)
}

// runCert runs "idemctl cert SUBCOMMAND ...".
func runCert(_ context.Context, args []string, stdout io.Writer) error {
	var o certOptions
	fs := flag.NewFlagSet("idemctl cert", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flagdoc.Register(fs, o.flags())
	// The global flags are accepted after the command name as for every
	// command (--config and --timeout have nothing to do here); --json
	// prints the files written as JSON.
	var g globals
	g.register(fs)
	positional, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		certUsage(stdout, fs)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cert: %w", err)
	}
	names := make([]string, len(certSubs))
	for i, s := range certSubs {
		names[i] = s.name
	}
	if len(positional) == 0 {
		return fmt.Errorf("cert needs a subcommand (%s; see idemctl cert --help)", strings.Join(names, ", "))
	}
	sub := findCertSub(positional[0])
	if sub == nil {
		return fmt.Errorf("cert: unknown subcommand %q (%s; see idemctl cert --help)", positional[0], strings.Join(names, ", "))
	}
	rest := positional[1:]
	var problems []string
	if o.dir == "" {
		problems = append(problems, "--certs-dir DIR is required")
	}
	if sub.needsID && o.id == "" {
		problems = append(problems, "--id ID is required")
	}
	if !sub.needsID && o.id != "" {
		problems = append(problems, "--id applies to create-node and create-router only")
	}
	if sub.name == "create-ca" && o.caKey != "" {
		problems = append(problems, "--ca-key applies to create-node, create-router and create-client only")
	}
	if len(rest) < sub.nargs[0] || (sub.nargs[1] >= 0 && len(rest) > sub.nargs[1]) {
		if sub.args == "" {
			problems = append(problems, fmt.Sprintf("takes no arguments, got %q", rest))
		} else {
			problems = append(problems, fmt.Sprintf("needs %s, got %d argument(s)", sub.args, len(rest)))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("cert %s: %s (see idemctl cert --help)", sub.name, strings.Join(problems, "; "))
	}
	files, err := sub.run(&o, rest)
	if err != nil {
		return fmt.Errorf("cert %s: %w", sub.name, err)
	}
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(o.dir, f)
	}
	if g.json {
		return json.NewEncoder(stdout).Encode(map[string][]string{"files": paths})
	}
	for _, p := range paths {
		fmt.Fprintln(stdout, "wrote", p)
	}
	return nil
}
