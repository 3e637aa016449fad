package cli

import (
	"io"
	"testing"
)

// Every command that prints JSON takes both --json and -o json|text, and
// the two spellings print the same (issue 15: models and gpus took only
// -o json, the others only --json).
func TestOutputSpellings(t *testing.T) {
	for _, c := range NewRoot(io.Discard, io.Discard).Commands() {
		json, output := c.Flags().Lookup("json") != nil, c.Flags().Lookup("output") != nil
		if json != output {
			t.Errorf("%s: --json %t, -o %t: want both or neither", c.Name(), json, output)
		}
	}
	for _, args := range [][]string{{"models"}, {"gpus"}, {"plan", "--model", "gpt2", "--gpu", "h100", "--no-timeline"}} {
		_, a, _ := run(append(args, "--json")...)
		_, b, _ := run(append(args, "-o", "json")...)
		_, text, _ := run(append(args, "--json", "-o", "json", "--output", "text", "-o", "json")...)
		if a == "" || a != b || a != text {
			t.Errorf("%q: --json and -o json print differently (%d, %d, %d bytes)", args, len(a), len(b), len(text))
		}
	}
	for _, args := range [][]string{{"models", "--json", "-o", "text"}, {"plan", "-o", "text", "--json"}, {"gpus", "--json=false", "-o", "json"}} {
		code, out, errs := run(args...)
		if code != 1 || out != "" || errs == "" {
			t.Errorf("%q: exit %d, %d bytes out, %q: want the disagreement refused", args, code, len(out), errs)
		}
	}
}
