// Package flagdoc holds idem's commands' flag tables and renders
// docs/configuration.md from them.
//
// Each command declares its flags in one Table: for each flag its name, a
// pointer to the setting it sets, its usage and its --help section.
// NewSet registers the table on a flag set; a flag's default is what its
// pointer holds then, so a command points its flags into a Config that
// holds the Config's defaults (node.DefaultConfig, proxy.DefaultConfig,
// ...) and help strings never repeat a default. Set.Parse prints --help by
// section; the Testing section (fault injection, allowed only with
// IDEM_ENABLE_FAULT_INJECTION=1) is left out of --help and printed by
// --help-testing. A renamed flag keeps its former name as an alias that
// still works and is warned of once (Set.Warn).
//
// Flag names follow one convention:
//
//   - lower-case words joined by hyphens: --max-response-bytes;
//   - a size ends in -bytes, a duration names what it bounds, not its unit
//     (--request-timeout, --raft-snapshot-interval); its value carries the unit;
//   - a bound starts with max- (--max-waiters), after the name of the
//     subsystem when it has one (--raft-max-conns);
//   - a setting of the Raft layer starts with raft-, a listener's address
//     ends in -addr and starts with its protocol (--grpc-addr);
//   - a test-only knob starts with testing- and sits in the Testing
//     section.
//
// The test of this package builds the commands, renders the page from
// their --help and --help-testing and fails when docs/configuration.md
// differs; with -update it rewrites the page instead.
package flagdoc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// Commands are the binaries the page covers, in its order.
var Commands = []string{"idemnode", "idemrouter", "idemctl", "idembench", "regionsim"}

// RunFunc runs command (one of Commands) with args and returns what it
// printed (its standard output, or its standard error when it printed its
// help there); an error when it fails or exits non-zero.
type RunFunc func(command string, args ...string) (string, error)

const header = `# Configuration

Every flag of idem's commands, as each prints it with ` + "`--help`" + `, and the test-only flags in
[Testing](#testing). This page is generated from the commands' flag tables: ` + "`go test ./internal/flagdoc -update`" + `
rewrites it after a flag changes, and ` + "`go test ./internal/flagdoc`" + ` fails while it differs from what
the binaries print. Do not edit it by hand. The API these flags configure is [api.md](api.md).

A flag's default is the default of the Config field it sets (` + "`node.DefaultConfig`" + `,
` + "`proxy.DefaultConfig`" + `, ...); where 0 has a meaning of its own, the usage says it.

Flag names follow one convention: lower-case words joined by hyphens; a size ends in ` + "`-bytes`" + `; a
duration names what it bounds, not its unit (` + "`--request-timeout`" + `); a bound starts with ` + "`max-`" + `,
after its subsystem's name when it has one (` + "`--raft-max-conns`" + `); a setting of the Raft layer starts
with ` + "`raft-`" + `; a listen address ends in ` + "`-addr`" + `; a test-only flag starts with ` + "`testing-`" + `. A
renamed flag keeps its former name, which still works and logs a warning once; --help shows it as
"formerly".

`

// Render returns the page: for each command its --help, and for idemctl
// also the --help of every command that idemctl --help lists.
func Render(run RunFunc) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header)
	for _, c := range Commands {
		fmt.Fprintf(&b, "- [%s](#%s)\n", c, c)
	}
	b.WriteString("- [Testing](#testing)\n")
	for _, c := range Commands {
		fmt.Fprintf(&b, "\n## %s\n", c)
		if err := section(&b, run, c); err != nil {
			return nil, err
		}
		if c != "idemctl" {
			continue
		}
		top, err := run(c, "--help")
		if err != nil {
			return nil, err
		}
		subs, err := IdemctlCommands(top)
		if err != nil {
			return nil, err
		}
		for _, s := range subs {
			fmt.Fprintf(&b, "\n### %s %s\n", c, s)
			if err := section(&b, run, c, s); err != nil {
				return nil, err
			}
		}
	}
	b.WriteString(testingIntro)
	for _, c := range Commands {
		top, err := run(c, "--help")
		if err != nil {
			return nil, err
		}
		if !strings.Contains(top, "--"+HelpTesting) {
			continue
		}
		fmt.Fprintf(&b, "\n### %s testing flags\n", c)
		if err := section(&b, run, c, "--"+HelpTesting); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}

const testingIntro = `
## Testing

Fault injection for tests only, in the Testing section of the commands' Config (` + "`node.Config.Testing`" + `).
--help leaves these flags out and --help-testing lists them. They work only with
` + "`IDEM_ENABLE_FAULT_INJECTION=1`" + ` in the environment: without it a command given one refuses to start.
Never set them in production.
`

// section writes "`command args --help`:" and the output in a code block;
// with a last argument that starts with --help, that one instead of --help.
func section(b *bytes.Buffer, run RunFunc, command string, args ...string) error {
	if len(args) == 0 || !strings.HasPrefix(args[len(args)-1], "--help") {
		args = append(args, "--help")
	}
	out, err := run(command, args...)
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) == "" {
		return fmt.Errorf("flagdoc: %s %s printed nothing", command, strings.Join(args, " "))
	}
	if strings.Contains(out, "```") {
		return fmt.Errorf("flagdoc: %s %s prints ``` and cannot sit in a code block", command, strings.Join(args, " "))
	}
	fmt.Fprintf(b, "\n`%s %s`:\n\n```text\n%s", command, strings.Join(args, " "), out)
	if !strings.HasSuffix(out, "\n") {
		b.WriteString("\n")
	}
	b.WriteString("```\n")
	return nil
}

// IdemctlCommands returns the command names of idemctl's --help: the first
// word of each line of its "Commands:" list, which ends at a blank line.
func IdemctlCommands(help string) ([]string, error) {
	var names []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "Commands:":
			in = true
		case in && strings.TrimSpace(line) == "":
			in = false
		case in:
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  ") {
				names = append(names, f[0])
			}
		}
	}
	if len(names) == 0 {
		return nil, errors.New("flagdoc: idemctl --help lists no commands under \"Commands:\"")
	}
	return names, nil
}
