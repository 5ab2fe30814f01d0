package docs

// The transcript format: parsing console blocks out of markdown, normalising
// volatile text, matching expected against actual output, and rewriting a
// document's expected output from a run. The rules are in doc.go.

import (
	"fmt"
	"regexp"
	"strings"
)

// doc is one markdown file and the runnable commands of its console blocks.
type doc struct {
	path  string
	lines []string // the file's lines, without their newlines
	cmds  []command
}

// command is one `$ ` command of a console block and the output the block
// expects from it.
type command struct {
	line       int      // 0-based index of the command's first line in doc.lines
	text       string   // what bash runs: the lines after "$ ", joined by newlines
	background bool     // it ends in " &": started, left running, killed at the end
	indent     string   // the block's indentation, put back on rewritten lines
	want       []string // expected output lines, indentation removed
	wantLine   int      // index of the first expected line (where they would go when none)
	wantEnd    int      // index one past the last expected line
}

// where names a command's place in its document for messages.
func (c command) where(path string) string {
	first, _, _ := strings.Cut(c.text, "\n")
	return fmt.Sprintf("%s:%d: $ %s", path, c.line+1, first)
}

var (
	fenceRe   = regexp.MustCompile("^( *)(`{3,}|~{3,})(.*)$")
	heredocRe = regexp.MustCompile(`<<(-?)\s*(?:'([A-Za-z_][A-Za-z0-9_]*)'|"([A-Za-z_][A-Za-z0-9_]*)"|([A-Za-z_][A-Za-z0-9_]*))`)
)

// parseDoc finds the console blocks of a markdown text and their commands.
func parseDoc(path, text string) (*doc, error) {
	d := &doc{path: path, lines: strings.Split(strings.TrimSuffix(text, "\n"), "\n")}
	for i := 0; i < len(d.lines); i++ {
		m := fenceRe.FindStringSubmatch(d.lines[i])
		if m == nil {
			continue
		}
		indent, fence, info := m[1], m[2], strings.TrimSpace(m[3])
		end := closingFence(d.lines, i+1, indent, fence)
		if end < 0 {
			return nil, fmt.Errorf("%s:%d: code block opened with %s is never closed", path, i+1, fence)
		}
		if info == "console" {
			cmds, err := parseBlock(path, d.lines, i+1, end, indent)
			if err != nil {
				return nil, err
			}
			d.cmds = append(d.cmds, cmds...)
		}
		i = end
	}
	return d, nil
}

// closingFence returns the index of the line that closes a block opened with
// fence indented by indent, searching from line from, or -1. As in
// CommonMark, the closing fence is at least as long as the opening one and
// indented by at most three spaces more (a fence indented further is text
// inside the block).
func closingFence(lines []string, from int, indent, fence string) int {
	for j := from; j < len(lines); j++ {
		t := strings.TrimLeft(lines[j], " ")
		if len(lines[j])-len(t) > len(indent)+3 {
			continue
		}
		rest := strings.TrimLeft(t, fence[:1])
		if len(t)-len(rest) >= len(fence) && strings.TrimSpace(rest) == "" {
			return j
		}
	}
	return -1
}

// parseBlock parses the lines [from, end) of a console block indented by
// indent.
func parseBlock(path string, lines []string, from, end int, indent string) ([]command, error) {
	var cmds []command
	for i := from; i < end; {
		line := strings.TrimPrefix(lines[i], indent)
		if !strings.HasPrefix(line, "$ ") {
			if len(cmds) == 0 {
				if strings.TrimSpace(line) == "" {
					i++
					continue
				}
				return nil, fmt.Errorf("%s:%d: console block has output before its first \"$ \" command: %q", path, i+1, line)
			}
			c := &cmds[len(cmds)-1]
			c.want = append(c.want, line)
			c.wantEnd = i + 1
			i++
			continue
		}
		c := command{line: i, indent: indent}
		body := []string{strings.TrimPrefix(line, "$ ")}
		i++
		// A trailing backslash continues the command on the next line.
		for strings.HasSuffix(body[len(body)-1], `\`) {
			if i >= end {
				return nil, fmt.Errorf("%s:%d: command ends in \\ but the block ends", path, c.line+1)
			}
			body = append(body, strings.TrimPrefix(lines[i], indent))
			i++
		}
		// Here-documents run to their terminator lines, in order.
		for _, m := range heredocRe.FindAllStringSubmatch(strings.Join(body, "\n"), -1) {
			word := m[2] + m[3] + m[4]
			for {
				if i >= end {
					return nil, fmt.Errorf("%s:%d: here-document %s is not terminated in its block", path, c.line+1, word)
				}
				l := strings.TrimPrefix(lines[i], indent)
				body = append(body, l)
				i++
				if l == word || m[1] == "-" && strings.TrimLeft(l, "\t") == word {
					break
				}
			}
		}
		c.text = strings.Join(body, "\n")
		if t := strings.TrimRight(c.text, " "); strings.HasSuffix(t, " &") {
			c.background = true
			c.text = strings.TrimSuffix(t, "&")
		}
		c.wantLine, c.wantEnd = i, i
		cmds = append(cmds, c)
	}
	for k := range cmds {
		cmds[k].want = trimTrailingBlank(cmds[k].want)
	}
	return cmds, nil
}

func trimTrailingBlank(lines []string) []string {
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// outputLines splits a command's combined output into lines, without the
// trailing blank ones.
func outputLines(out string) []string {
	if out == "" {
		return nil
	}
	return trimTrailingBlank(strings.Split(strings.ReplaceAll(out, "\r\n", "\n"), "\n"))
}

// goRunRe matches `go run ./cmd/X`, which a transcript runs as the built X.
var goRunRe = regexp.MustCompile(`\bgo run \./cmd/([a-z][a-z0-9]*)\b/?`)

// shellText is the command as the transcript runs it.
func (c command) shellText() string { return goRunRe.ReplaceAllString(c.text, "$1") }

// A normalisation rule: text matching re reads as repl, in expected and in
// actual output alike. The list is documented in doc.go; keep them in step.
type rule struct {
	name string
	re   *regexp.Regexp
	repl string
}

var rules = []rule{
	{"UUID", regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), "<uuid>"},
	{"RFC 3339 time", regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})?`), "<time>"},
	{"owner token", regexp.MustCompile(`("owner_token"\s*:\s*"|\bowner_token=|\bowner=)[A-Za-z0-9_-]{22}\b`), "${1}<owner-token>"},
	{"duration", regexp.MustCompile(`\b(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+\b`), "<duration>"},
	// Last: a table's columns are as wide as their widest (volatile) value.
	{"column gap", regexp.MustCompile(`(\S)  +`), "$1  "},
}

// normalise applies every rule to one line.
func normalise(line string) string {
	line = strings.TrimRight(line, " \t")
	for _, r := range rules {
		line = r.re.ReplaceAllString(line, r.repl)
	}
	return line
}

// ellipsis in an expected line matches any text on that line; a line that is
// only the ellipsis matches any number of lines (none included).
const ellipsis = "..."

// matchOutput reports whether actual output lines match the expected ones
// after normalisation.
func matchOutput(want, got []string) bool {
	w := make([]string, len(want))
	for i, l := range want {
		w[i] = normalise(l)
	}
	g := make([]string, len(got))
	for i, l := range got {
		g[i] = normalise(l)
	}
	return matchLines(w, g)
}

func matchLines(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if strings.TrimSpace(want[0]) == ellipsis {
		for skip := 0; skip <= len(got); skip++ {
			if matchLines(want[1:], got[skip:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && matchLine(want[0], got[0]) && matchLines(want[1:], got[1:])
}

func matchLine(want, got string) bool {
	if !strings.Contains(want, ellipsis) {
		return want == got
	}
	parts := strings.Split(want, ellipsis)
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(got)
}

// containsInOrder reports whether every expected line matches some actual
// line, in order (the check for a background process's output, which keeps
// growing while the transcript runs).
func containsInOrder(want, got []string) bool {
	j := 0
	for _, w := range want {
		w = normalise(w)
		if strings.TrimSpace(w) == ellipsis {
			continue
		}
		for j < len(got) && !matchLine(w, normalise(got[j])) {
			j++
		}
		if j == len(got) {
			return false
		}
		j++
	}
	return true
}

// rewrite returns the document's text with the expected output of command k
// replaced by outputs[k] wherever outputs has an entry for k; commands and
// every other line stay as they are.
func (d *doc) rewrite(outputs map[int][]string) string {
	var b strings.Builder
	next := 0
	for k, c := range d.cmds {
		out, ok := outputs[k]
		if !ok {
			continue
		}
		// Keep blank lines that separated the old output from what follows.
		end := c.wantEnd
		for end > c.wantLine && strings.TrimSpace(d.lines[end-1]) == "" {
			end--
		}
		for _, l := range d.lines[next:c.wantLine] {
			b.WriteString(l + "\n")
		}
		for _, l := range out {
			if l == "" {
				b.WriteString("\n")
				continue
			}
			b.WriteString(c.indent + l + "\n")
		}
		next = end
	}
	for _, l := range d.lines[next:] {
		b.WriteString(l + "\n")
	}
	return b.String()
}
