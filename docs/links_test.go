package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository's root, seen from this package's directory.
const repoRoot = ".."

// TestRelativeLinksResolve checks every relative link of every Markdown file
// of the repository (README.md, docs/**, the DESIGN files, ...): its file or
// directory exists, and a #fragment names a heading of the Markdown file it
// points to. Links to other sites are not followed.
func TestRelativeLinksResolve(t *testing.T) {
	files := markdownFiles(t, repoRoot)
	if len(files) < 5 {
		t.Fatalf("found only %d Markdown files under %s: %v", len(files), repoRoot, files)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a
	}
	checked := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, file)
		for _, l := range markdownLinks(string(b)) {
			if !isRelative(l.target) {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(l.target, "#")
			dest := file
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", rel, l.line, l.target, path)
					continue
				}
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s:%d: link %q: a #fragment into a file that is not Markdown", rel, l.line, l.target)
				continue
			}
			if !anchorsOf(dest)[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", rel, l.line, l.target, filepath.Base(dest), frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link parser is broken")
	}
	t.Logf("%d relative links in %d Markdown files", checked, len(files))
}

// markdownFiles lists the *.md files under root, leaving out VCS metadata,
// installed packages and test data.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "vendor":
				return filepath.SkipDir
			}
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type link struct {
	target string
	line   int
}

var (
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^()\s<>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLink    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpan   = regexp.MustCompile("`[^`]*`")
)

// markdownLinks returns the targets of the inline links, images and link
// reference definitions of a Markdown text, outside fenced code blocks and
// code spans.
func markdownLinks(text string) []link {
	var out []link
	for _, pl := range proseLines(text) {
		line := pl.text
		if strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t") {
			continue // an indented code block (or a list item's continuation, which has no links here)
		}
		line = codeSpan.ReplaceAllString(line, "")
		if m := refLink.FindStringSubmatch(line); m != nil {
			out = append(out, link{target: m[1], line: pl.n})
			continue
		}
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			out = append(out, link{target: m[1], line: pl.n})
		}
	}
	return out
}

type proseLine struct {
	text string
	n    int // 1-based line number
}

// proseLines returns the lines of a Markdown text that are outside fenced
// code blocks.
func proseLines(text string) []proseLine {
	var out []proseLine
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
		default:
			out = append(out, proseLine{text: line, n: i + 1})
		}
	}
	return out
}

// isRelative reports whether a link target is a path inside the repository
// (or a fragment of the same file) rather than another site.
func isRelative(target string) bool {
	if strings.HasPrefix(target, "//") {
		return false
	}
	if i := strings.IndexAny(target, ":/#"); i >= 0 && target[i] == ':' {
		return false // a scheme: https:, mailto:, ...
	}
	return true
}

var headingLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// headingAnchors returns the anchors GitHub gives the ATX headings of a
// Markdown text: lower case, punctuation dropped, spaces to '-', and -1, -2
// appended to repeats.
func headingAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, pl := range proseLines(text) {
		line := pl.text
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimLeft(line, "#")
		if title == "" || title[0] != ' ' || len(line)-len(title) > 6 {
			continue
		}
		a := slug(title)
		if n := seen[a]; n > 0 {
			out[a+"-"+itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is GitHub's anchor for a heading's text.
func slug(title string) string {
	title = headingLink.ReplaceAllString(strings.TrimSpace(title), "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for ; n > 0; n /= 10 {
		d = append([]byte{byte('0' + n%10)}, d...)
	}
	return string(d)
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Stuck keys and waiting callers: `idemctl keys`", "stuck-keys-and-waiting-callers-idemctl-keys"},
		{"Survival modes: what each guarantees and costs", "survival-modes-what-each-guarantees-and-costs"},
		{"Go's system monitor: an opt-in", "gos-system-monitor-an-opt-in"},
		{"bench/peers: idem against the stores teams use", "benchpeers-idem-against-the-stores-teams-use"},
		{"POST /v1/namespaces/{ns}/keys/{key}:reserve", "post-v1namespacesnskeyskeyreserve"},
		{"A [linked](x.md) title", "a-linked-title"},
		{"snake_case and UPPER", "snake_case-and-upper"},
	} {
		if got := slug(c.in); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestHeadingAnchors(t *testing.T) {
	a := headingAnchors("# Title\n\n## Usage\n```sh\n# not a heading\n```\n## Usage\n#hashtag\n####### seven\n")
	for _, want := range []string{"title", "usage", "usage-1"} {
		if !a[want] {
			t.Errorf("anchor %q missing from %v", want, a)
		}
	}
	for _, not := range []string{"not-a-heading", "hashtag", "seven"} {
		if a[not] {
			t.Errorf("anchor %q should not exist: %v", not, a)
		}
	}
}

func TestMarkdownLinks(t *testing.T) {
	text := "See [a](a.md#x) and ![img](p.png \"t\") and `[code](no.md)`.\n" +
		"```sh\n[fenced](no.md)\n```\n" +
		"    [indented](no.md)\n" +
		"[ref]: ../b.md\n" +
		"[ext](https://example.com) [same](#here)\n"
	var got []string
	for _, l := range markdownLinks(text) {
		got = append(got, l.target)
	}
	want := []string{"a.md#x", "p.png", "../b.md", "https://example.com", "#here"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("links = %q, want %q", got, want)
	}
	for target, rel := range map[string]bool{"a.md": true, "#here": true, "../x/y.md#z": true, "https://x.org/": false, "mailto:a@b": false, "//cdn.example/x": false} {
		if isRelative(target) != rel {
			t.Errorf("isRelative(%q) = %v, want %v", target, !rel, rel)
		}
	}
}
