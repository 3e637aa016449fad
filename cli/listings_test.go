package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestListingsJSON: `memplan gpus -o json` and `memplan models -o json`
// list every catalog entry with its figures; the text table shows the
// datasheet capacity in decimal GB beside the usable GiB; an unknown
// format is one line and exit 1.
func TestListingsJSON(t *testing.T) {
	code, out, errs := run("gpus", "-o", "json")
	if code != 0 {
		t.Fatalf("gpus -o json: exit %d: %s", code, errs)
	}
	var g struct {
		Schema string
		GPUs   []struct {
			Name        string
			Memory      int64 `json:"memory_bytes"`
			TotalMemory int64 `json:"total_memory_bytes"`
			Source      string
		}
	}
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, r := range g.GPUs {
		names[r.Name] = true
		if r.TotalMemory <= 0 || r.Memory <= 0 || r.Source == "" {
			t.Errorf("%+v", r)
		}
	}
	for _, n := range []string{"b200", "mi300x", "a10g", "l40s", "gh200", "h100-sxm"} {
		if !names[n] {
			t.Errorf("gpus -o json lacks %s", n)
		}
	}
	if g.Schema != "memplan.gpus/v1" {
		t.Errorf("schema %q", g.Schema)
	}
	code, out, errs = run("models", "-o", "json")
	if code != 0 {
		t.Fatalf("models -o json: exit %d: %s", code, errs)
	}
	var m struct {
		Schema string
		Models []struct {
			Name   string
			Params int64
		}
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range m.Models {
		if r.Name == "llama-3-70b" && r.Params == 70553706496 {
			found = true
		}
	}
	if m.Schema != "memplan.models/v1" || !found {
		t.Errorf("models -o json: schema %q, llama-3-70b with 70,553,706,496 parameters found %v", m.Schema, found)
	}
	if code, out, _ := run("gpus"); code != 0 || !strings.Contains(out, "80 GB") || !strings.Contains(out, "DATASHEET") {
		t.Errorf("gpus text: exit %d\n%s", code, out)
	}
	for _, cmd := range []string{"gpus", "models"} {
		code, _, errs := run(cmd, "-o", "yaml")
		if code != 1 || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, `--output "yaml": want text or json`) {
			t.Errorf("%s -o yaml: exit %d, %q", cmd, code, errs)
		}
	}
}
