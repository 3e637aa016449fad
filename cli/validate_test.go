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
