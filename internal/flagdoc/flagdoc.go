// Package flagdoc renders docs/configuration.md, the reference of every
// flag of idem's commands, from the commands' own --help output, so the
// reference says exactly what the binaries print. Its test builds the
// commands, renders the page and fails when docs/configuration.md differs;
// with -update it rewrites the page instead.
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

Every flag of idem's commands, as each prints it with ` + "`--help`" + `. This page is generated from the
binaries: ` + "`go test ./internal/flagdoc -update`" + ` rewrites it after a flag changes, and
` + "`go test ./internal/flagdoc`" + ` fails while it differs from what the binaries print. Do not edit it by
hand. The API these flags configure is [api.md](api.md).

`

// Render returns the page: for each command its --help, and for idemctl
// also the --help of every command that idemctl --help lists.
func Render(run RunFunc) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header)
	for _, c := range Commands {
		fmt.Fprintf(&b, "- [%s](#%s)\n", c, c)
	}
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
	return b.Bytes(), nil
}

// section writes "`command args --help`:" and the output in a code block.
func section(b *bytes.Buffer, run RunFunc, command string, args ...string) error {
	args = append(args, "--help")
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
