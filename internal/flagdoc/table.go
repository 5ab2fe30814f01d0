package flagdoc

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Testing is the section of the test-only flags: --help leaves it out and
// --help-testing prints it alone. Its flags start with "testing-".
const Testing = "Testing"

// HelpTesting is the flag that prints a command's Testing section.
const HelpTesting = "help-testing"

// Flag is one entry of a command's flag table.
type Flag struct {
	// Name is the flag's name without dashes, following the naming
	// convention of the package doc.
	Name string
	// Value points at the setting the flag sets: *string, *bool, *int,
	// *int64, *uint64, *float64, *time.Duration, or any flag.Value. What
	// it holds when the table is registered is the flag's default, so
	// point it into a Config that holds its defaults (Config.Default or
	// DefaultConfig) and the flag's default is the Config's.
	Value any
	// Usage is the help text; a name in back quotes is the value's
	// placeholder, as with the flag package. It does not repeat the
	// default: --help prints it from Value.
	Usage string
	// Section groups the flag in --help; Testing hides it there.
	Section string
	// Aliases are former names that still work, each with a warning that
	// names the new one (Set.Warn).
	Aliases []string
}

// Table is a command's flags, in sections.
type Table struct {
	// Command is the command's name (the flag set's).
	Command string
	// Sections orders the sections in --help; a section of Flags not in
	// it comes after them, in the order of first appearance.
	Sections []string
	Flags    []Flag
}

// Set is a Table registered on a flag set.
type Set struct {
	fs      *flag.FlagSet
	tab     Table
	aliases map[string]string // former name -> name
	used    []string          // former names given, in order, once each
}

// NewSet registers every flag of t, and its aliases, on a new flag set
// named t.Command. It panics on an unsupported Value or a duplicate name:
// both are programming errors caught by any test that builds the table.
func NewSet(t Table) *Set {
	s := &Set{fs: flag.NewFlagSet(t.Command, flag.ContinueOnError), tab: t, aliases: map[string]string{}}
	s.fs.SetOutput(io.Discard)
	for _, f := range t.Flags {
		for _, a := range f.Aliases {
			s.aliases[a] = f.Name
		}
	}
	Register(s.fs, t.Flags)
	return s
}

// Register registers flags, and their former names, on fs: for a command
// whose flag sets are built per subcommand rather than parsed by a Set.
// Like NewSet it panics on an unsupported Value or a duplicate name.
func Register(fs *flag.FlagSet, flags []Flag) {
	for _, f := range flags {
		register(fs, f.Name, f)
		for _, a := range f.Aliases {
			register(fs, a, f)
		}
	}
}

func register(fs *flag.FlagSet, name string, f Flag) {
	switch p := f.Value.(type) {
	case *string:
		fs.StringVar(p, name, *p, f.Usage)
	case *bool:
		fs.BoolVar(p, name, *p, f.Usage)
	case *int:
		fs.IntVar(p, name, *p, f.Usage)
	case *int64:
		fs.Int64Var(p, name, *p, f.Usage)
	case *uint64:
		fs.Uint64Var(p, name, *p, f.Usage)
	case *float64:
		fs.Float64Var(p, name, *p, f.Usage)
	case *time.Duration:
		fs.DurationVar(p, name, *p, f.Usage)
	case flag.Value:
		fs.Var(p, name, f.Usage)
	default:
		panic(fmt.Sprintf("flagdoc: flag --%s: unsupported value %T", name, f.Value))
	}
}

// FlagSet is the flag set the table is registered on.
func (s *Set) FlagSet() *flag.FlagSet { return s.fs }

// Parse parses args. On --help it prints header and the flags by section,
// the Testing section left out, to stdout and returns flag.ErrHelp; on
// --help-testing it prints the Testing section alone. A stray positional
// argument is an error. A former name given sets its flag and is
// remembered for Warn.
func (s *Set) Parse(args []string, stdout io.Writer, header string) error {
	if slices.Contains(args, "--"+HelpTesting) || slices.Contains(args, "-"+HelpTesting) {
		s.PrintSection(stdout, Testing)
		return flag.ErrHelp
	}
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, header)
			s.PrintHelp(stdout)
		}
		return err
	}
	if s.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --; see --help)", s.fs.Arg(0))
	}
	s.fs.Visit(func(f *flag.Flag) {
		if _, ok := s.aliases[f.Name]; ok {
			s.used = append(s.used, f.Name)
		}
	})
	return nil
}

// Deprecated returns one line for each former name given to Parse:
// "--old is deprecated: use --new".
func (s *Set) Deprecated() []string {
	var out []string
	for _, a := range s.used {
		out = append(out, fmt.Sprintf("--%s is deprecated: use --%s", a, s.aliases[a]))
	}
	return out
}

// Warn logs a warning for each former name given to Parse, once.
func (s *Set) Warn(log *slog.Logger) {
	for _, a := range s.used {
		log.Warn("deprecated flag name: it still works, but will be removed", "flag", "--"+a, "use", "--"+s.aliases[a])
	}
	s.used = nil
}

// Given reports whether the flag name (or a former name of it) was set
// on the command line.
func (s *Set) Given(name string) bool {
	given := false
	s.fs.Visit(func(f *flag.Flag) {
		given = given || f.Name == name || s.aliases[f.Name] == name
	})
	return given
}

// sections returns the sections in help order.
func (s *Set) sections() []string {
	out := slices.Clone(s.tab.Sections)
	for _, f := range s.tab.Flags {
		if !slices.Contains(out, f.Section) {
			out = append(out, f.Section)
		}
	}
	return out
}

// PrintHelp writes the flags, section by section (a "Section:" line, then
// the flags in name order), leaving out the Testing section; when there
// is one, a last line says how to list it.
func (s *Set) PrintHelp(w io.Writer) {
	testing := false
	for i, sec := range s.sections() {
		if sec == Testing {
			testing = true
			continue
		}
		if i > 0 {
			fmt.Fprintln(w)
		}
		s.PrintSection(w, sec)
	}
	if testing {
		fmt.Fprintf(w, "\nTest-only flags (fault injection) are left out here: --%s lists them.\n", HelpTesting)
	}
}

// PrintSection writes the "Section:" line and the section's flags in name
// order, as "--name VALUE", the usage and the default.
func (s *Set) PrintSection(w io.Writer, section string) {
	var names []string
	for _, f := range s.tab.Flags {
		if f.Section == section {
			names = append(names, f.Name)
		}
	}
	slices.Sort(names)
	name := section
	if name == "" {
		name = "Flags"
	}
	fmt.Fprintf(w, "%s:\n", name)
	for _, n := range names {
		printFlag(w, s.fs.Lookup(n), s.aliasesOf(n))
	}
}

func (s *Set) aliasesOf(name string) []string {
	for _, f := range s.tab.Flags {
		if f.Name == name {
			return f.Aliases
		}
	}
	return nil
}

// PrintFlags writes every flag of fs, in name order, as --help prints a
// table's: "--name VALUE", then the usage and the default, the way the
// README and the contract spell flags. It is for flag sets that are not
// built from a Table.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) { printFlag(w, f, nil) })
}

func printFlag(w io.Writer, f *flag.Flag, aliases []string) {
	name, usage := flag.UnquoteUsage(f)
	line := "  --" + f.Name
	if name != "" {
		line += " " + name
	}
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, "        %s", strings.ReplaceAll(usage, "\n", "\n        "))
	if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
		fmt.Fprintf(w, " (default %s)", f.DefValue)
	}
	if len(aliases) > 0 {
		fmt.Fprintf(w, " (formerly --%s)", strings.Join(aliases, ", --"))
	}
	fmt.Fprintln(w)
}
