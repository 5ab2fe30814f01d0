package flagdoc

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"
)

type settings struct {
	Name    string
	Size    int64
	Timeout time.Duration
	Fault   uint64
}

func testTable(s *settings) Table {
	return Table{Command: "cmd", Sections: []string{"Main", Testing, "Limits"}, Flags: []Flag{
		{Name: "size-bytes", Aliases: []string{"size"}, Value: &s.Size, Section: "Limits", Usage: "largest thing in `BYTES`"},
		{Name: "name", Value: &s.Name, Section: "Main", Usage: "the `NAME`"},
		{Name: "request-timeout", Value: &s.Timeout, Section: "Main", Usage: "deadline `D`"},
		{Name: "testing-fault-after", Value: &s.Fault, Section: Testing, Usage: "fail after `N`"},
	}}
}

// TestSetDefaultsFromValues: a flag's default is what its pointer held
// when the table was registered, and --help prints it.
func TestSetDefaultsFromValues(t *testing.T) {
	s := settings{Size: 4096, Timeout: 5 * time.Second}
	set := NewSet(testTable(&s))
	var out bytes.Buffer
	if err := set.Parse([]string{"--help"}, &out, "usage\n\n"); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help: err %v, want flag.ErrHelp", err)
	}
	want := "usage\n\nMain:\n  --name NAME\n        the NAME\n  --request-timeout D\n        deadline D (default 5s)\n\n" +
		"Limits:\n  --size-bytes BYTES\n        largest thing in BYTES (default 4096) (formerly --size)\n\n" +
		"Test-only flags (fault injection) are left out here: --help-testing lists them.\n"
	if out.String() != want {
		t.Errorf("--help printed\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	if err := set.Parse([]string{"--name", "x", "--help-testing"}, &out, "usage\n"); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("--help-testing: err %v, want flag.ErrHelp", err)
	}
	if want := "Testing:\n  --testing-fault-after N\n        fail after N\n"; out.String() != want {
		t.Errorf("--help-testing printed %q, want %q", out.String(), want)
	}
}

// TestSetAliases: a former name sets the flag, is reported by Deprecated
// and warned of once by Warn; the new name is not.
func TestSetAliases(t *testing.T) {
	var s settings
	set := NewSet(testTable(&s))
	if err := set.Parse([]string{"--size", "7", "--size", "9", "--name", "a"}, &bytes.Buffer{}, ""); err != nil {
		t.Fatal(err)
	}
	if s.Size != 9 || s.Name != "a" {
		t.Errorf("settings %+v, want size 9 and name a", s)
	}
	if !set.Given("size-bytes") || !set.Given("name") || set.Given("request-timeout") {
		t.Errorf("Given: size-bytes %v, name %v, request-timeout %v", set.Given("size-bytes"), set.Given("name"), set.Given("request-timeout"))
	}
	if d := set.Deprecated(); len(d) != 1 || d[0] != "--size is deprecated: use --size-bytes" {
		t.Errorf("Deprecated() = %q", d)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	set.Warn(log)
	set.Warn(log)
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || !strings.Contains(logs.String(), "flag=--size use=--size-bytes") {
		t.Errorf("%d warnings, want one naming --size-bytes:\n%s", n, logs.String())
	}

	set = NewSet(testTable(&s))
	if err := set.Parse([]string{"--size-bytes", "1"}, &bytes.Buffer{}, ""); err != nil {
		t.Fatal(err)
	}
	if d := set.Deprecated(); len(d) != 0 {
		t.Errorf("the new name is reported as deprecated: %q", d)
	}
}

func TestSetErrors(t *testing.T) {
	var s settings
	set := NewSet(testTable(&s))
	if err := set.Parse([]string{"--size-bytes", "x"}, &bytes.Buffer{}, ""); err == nil || !strings.Contains(err.Error(), `invalid value "x" for flag -size-bytes`) {
		t.Errorf("bad value: err %v", err)
	}
	set = NewSet(testTable(&s))
	if err := set.Parse([]string{"--name", "a", "extra"}, &bytes.Buffer{}, ""); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Errorf("stray argument: err %v", err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "unsupported value") {
			t.Errorf("an unsupported value: recovered %v, want a panic naming it", r)
		}
	}()
	NewSet(Table{Flags: []Flag{{Name: "bad", Value: new(int32)}}})
}
