package cli

import (
	"bytes"
	"os"
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
