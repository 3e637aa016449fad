package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// explain --against on a real snapshot whose workload is known: Wedsonlin's
// CS336 "medium" LM (1024/4096, 24 layers, 16 heads, vocab 10000, ctx 128,
// batch 4, fp32, the course's per-parameter AdamW; ../shared/snapshots'
// README and summary config; cli/testdata/cs336-medium.config.json is that
// model as a llama config: RMSNorm, SwiGLU, RoPE, untied head, 423,183,360
// parameters as the summary says). memplan's allocated peak is within 3% of
// the snapshot's, and the largest category disagreement is named.
func TestExplainAgainstKnownWorkload(t *testing.T) {
	snap := filepath.Join("..", "..", "shared", "snapshots", "raw", "Wedsonlin__assignment2-systems__8630bcfe__results_medium_128_training_memory_snapshot.pickle")
	if _, err := os.Stat(snap); err != nil {
		t.Fatalf("the shared snapshots are missing: %v", err)
	}
	plan := []string{"--model", filepath.Join("testdata", "cs336-medium.config.json"), "--micro-batch", "4", "--seq", "128",
		"--precision", "fp32", "--optimizer", "adamw", "--optimizer-impl", "single", "--attention", "eager"}
	var out, errb bytes.Buffer
	if rc := Main(append([]string{"explain", snap, "--json", "--against", "flags"}, plan...), &out, &errb); rc != 0 {
		t.Fatal(errb.String())
	}
	var got struct {
		Against againstJSON `json:"against"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	a := got.Against
	if a.RelError > 0.03 || a.RelError < -0.03 || a.Largest == "" || len(a.Rows) < 4 {
		t.Errorf("against: %+v", a)
	}
	// The same through a plan JSON file.
	dir := t.TempDir()
	out.Reset()
	if rc := Main(append([]string{"plan", "--json", "--no-timeline"}, plan...), &out, &errb); rc != 0 {
		t.Fatal(errb.String())
	}
	pj := filepath.Join(dir, "plan.json")
	if err := os.WriteFile(pj, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if rc := Main([]string{"explain", snap, "--against", pj}, &out, &errb); rc != 0 {
		t.Fatal(errb.String())
	}
	if !strings.Contains(out.String(), "largest disagreement: "+a.Largest) {
		t.Errorf("text form:\n%s", out.String())
	}
	t.Logf("%+v", a)
}

func TestExplainAgainstBadInput(t *testing.T) {
	dir := t.TempDir()
	notJSON := filepath.Join(dir, "x.json")
	other := filepath.Join(dir, "other.json")
	os.WriteFile(notJSON, []byte("{"), 0o644)
	os.WriteFile(other, []byte(`{"schema": "memplan.compare/v1"}`), 0o644)
	snap := filepath.Join("..", "testdata", "snapshots", "MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle")
	for _, c := range []struct{ against, want string }{
		{filepath.Join(dir, "missing.json"), "--against: open"},
		{notJSON, "not a plan JSON"},
		{other, `schema "memplan.compare/v1"`},
	} {
		var out, errb bytes.Buffer
		if rc := Main([]string{"explain", snap, "--against", c.against}, &out, &errb); rc != 1 {
			t.Errorf("%s: exit %d", c.against, rc)
		}
		if !strings.Contains(errb.String(), c.want) || strings.Count(errb.String(), "\n") != 1 || out.Len() != 0 {
			t.Errorf("%s: %q, want one line with %q", c.against, errb.String(), c.want)
		}
	}
}
