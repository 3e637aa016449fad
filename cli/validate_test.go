package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runValidate(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	c := newValidateCmd(&out)
	c.SetArgs(args)
	c.SetOut(&out)
	c.SetErr(&out)
	c.SilenceUsage, c.SilenceErrors = true, true
	err := c.Execute()
	if err != nil {
		record(message(err))
	}
	return out.String(), err
}

func TestValidateSuite(t *testing.T) {
	out, err := runValidate(t, measuredPath(), "--tolerance", "3%")
	t.Log("\n" + out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "phase peaks: median") {
		t.Errorf("no summary line:\n%s", out)
	}
}

func measuredPath() string {
	if p := os.Getenv("MEMPLAN_MEASURED"); p != "" {
		return p
	}
	return "../testdata/torch/measured.json"
}

func TestValidateBeyondToleranceFails(t *testing.T) {
	out, err := runValidate(t, measuredPath(), "--tolerance", "0.5%")
	if !errors.Is(err, ErrValidation) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(out, "beyond tolerance") || !strings.Contains(out, "FAIL at tolerance 0.50%") {
		t.Errorf("output:\n%s", out)
	}
}

func TestValidateJSON(t *testing.T) {
	out, err := runValidate(t, measuredPath(), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Schema string `json:"schema"`
		Pass   bool   `json:"pass"`
		Rows   []any  `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Schema != "memplan.validation/v1" || !rep.Pass || len(rep.Rows) == 0 {
		t.Errorf("%+v", rep)
	}
}

func TestValidateBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nope.json"}, "nope.json: no such file or directory"},
		{[]string{measuredPath(), "--tolerance", "three"}, `--tolerance "three"`},
		{[]string{measuredPath(), "--traces", "/nonexistent"}, "/nonexistent/"},
		// --traces was ignored with --published (its rows name no traces).
		{[]string{"--published", "nope.jsonl", "--traces", "/nonexistent"}, "--traces is for a measured file"},
		{[]string{"--published", "nope.jsonl", "--traces", ""}, "--traces is for a measured file"},
	} {
		_, err := runValidate(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want %q", c.args, err, c.want)
		}
	}
}

// A measured peak of 0 made --json fail on +Inf after the work was done,
// and a negative one printed a meaningless error: both are bad input, one
// line and nothing on stdout, with or without --json.
func TestValidateRefusesNonPositivePeak(t *testing.T) {
	data, err := os.ReadFile(measuredPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, from, to, want string }{
		{"zero", `"forward":127914080`, `"forward":0`, `phases.forward is 0 bytes: a measured peak must be positive`},
		{"negative", `"backward":159656072`, `"backward":-5`, `phases.backward is -5 bytes`},
		{"empty", `"phases":{"forward":127914080,"backward":159656072,"optimizer":134973696}`, `"phases":{}`, `missing "phases.forward"`},
	} {
		if !bytes.Contains(data, []byte(c.from)) {
			t.Fatalf("%s: %s not in %s", c.name, c.from, measuredPath())
		}
		path := filepath.Join(t.TempDir(), "measured.json")
		if err := os.WriteFile(path, bytes.Replace(data, []byte(c.from), []byte(c.to), 1), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, js := range []bool{false, true} {
			args := []string{path, "--traces", filepath.Dir(measuredPath())}
			if js {
				args = append(args, "--json")
			}
			out, err := runValidate(t, args...)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || out != "" {
				t.Errorf("%s %v: got %v, stdout %q; want one line containing %q", c.name, args[2:], err, out, c.want)
			}
		}
	}
}

// A bare number is a fraction, so "--tolerance 3" meant 300% and passed
// everything silently: a bare number over 1 is refused with the two
// spellings that say 3%.
func TestParseTolerance(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		err  string
	}{
		{"3%", 0.03, ""},
		{" 0.5% ", 0.005, ""},
		{"150%", 1.5, ""},
		{"0.03", 0.03, ""},
		{"1", 1, ""},
		{"0", 0, ""},
		{"3", 0, `--tolerance "3": give a fraction (0.03) or a percentage (3%)`},
		{"12.5", 0, `--tolerance "12.5": give a fraction (0.125) or a percentage (12.5%)`},
		{"1.0001", 0, `a fraction (0.010001) or a percentage (1.0001%)`},
		{"1e309", 0, `--tolerance "1e309": want a percentage such as 3% or a fraction such as 0.03`},
		{"Inf", 0, `--tolerance "Inf": want`},
		{"-0.5", 0, `--tolerance "-0.5": want`},
		{"three", 0, `--tolerance "three": want`},
	} {
		got, err := parseTolerance(c.in)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%q: got %v, %v; want %v", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: got %v, %v; want an error containing %q", c.in, got, err, c.err)
		case err != nil:
			record(err.Error())
		}
	}
}
