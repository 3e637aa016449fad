package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// diagnose SNAPSHOT --capacity: the MAGMA27 run (12.97 GiB allocated peak)
// replayed on a 12 GiB device runs out in its forward with activations the
// largest object alive, exit 3 (it does not fit, as plan's); on a device it
// fits, exit 0 and a line saying so (it was exit 1, bad input, while an
// out-of-memory exited 0); bad input gets one line and exit 1.
func TestDiagnoseSnapshot(t *testing.T) {
	snap := filepath.Join("..", "testdata", "snapshots", "MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle")
	var out, errb bytes.Buffer
	if rc := Main([]string{"diagnose", snap, "--capacity", "12GiB", "--json"}, &out, &errb); rc != ExitDoesNotFit {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	var got struct {
		Schema string `json:"schema"`
		Phase  string `json:"phase"`
		Live   struct {
			Bytes      int64 `json:"bytes"`
			ByCategory []struct {
				Name string `json:"name"`
			} `json:"by_category"`
		} `json:"live"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Schema != "memplan.diagnose-oom/v1" || got.Phase != "forward" || got.Live.Bytes > 12<<30 || got.Live.ByCategory[0].Name != "activations" {
		t.Errorf("%s", out.String())
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"diagnose", snap, "--capacity", "100GiB"}, snap + " fits in 100.00 GiB (--capacity): replayed through the allocator model, it reserves at most 13.12 GiB"},
		{[]string{"diagnose", snap, "--gpu", "h100"}, "(--gpu h100: its memory less the CUDA context)"},
		{[]string{"diagnose", snap, "--capacity", "100GiB", "--json"}, `"fits": true`},
	} {
		var out, errb bytes.Buffer
		if rc := Main(c.args, &out, &errb); rc != 0 || !strings.Contains(out.String(), c.want) || errb.Len() != 0 {
			t.Errorf("%v: exit %d, %q %q; want exit 0 and %q", c.args, rc, out.String(), errb.String(), c.want)
		}
	}
	dir := t.TempDir()
	junk := filepath.Join(dir, "x.pickle")
	timeline := filepath.Join("..", "testdata", "profiler", "cpu_mlp_step.json.gz")
	os.WriteFile(junk, []byte("\x80\x02K\x01."), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"diagnose", snap}, "give --capacity"},
		{[]string{"diagnose", snap, "--capacity", "lots"}, "--capacity \"lots\""},
		{[]string{"diagnose", timeline, "--capacity", "1GiB"}, "for its peak run memplan explain " + timeline},
		{[]string{"diagnose", snap, "--device", "7", "--capacity", "1GiB"}, "--device 7: " + snap + " has devices [0]"},
		{[]string{"explain", snap, "--device", "7"}, "--device 7: " + snap + " has devices [0]"},
		{[]string{"diagnose", junk, "--capacity", "1GiB"}, "not a CUDA memory snapshot"},
		{[]string{"diagnose", "--model", "gpt2", "--capacity", "1GiB"}, "only with a snapshot"},
		{[]string{"diagnose", snap, snap}, "diagnose takes [SNAPSHOT]: got 2 arguments"},
	} {
		var out, errb bytes.Buffer
		rc := Main(c.args, &out, &errb)
		if rc != 1 || !strings.Contains(errb.String(), c.want) || strings.Count(errb.String(), "\n") != 1 || out.Len() != 0 {
			t.Errorf("%v: exit %d, %q; want one line with %q", c.args, rc, errb.String(), c.want)
		}
	}
}

// A snapshot's flags given to diagnose of a job are refused naming the one
// given, -o json as written (sweep F, round 26: the refusal named --json).
func TestDiagnoseSnapshotFlagsNamedAsGiven(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"-o", "json"}, "memplan: -o json: only with a snapshot file"},
		{[]string{"--json"}, "memplan: --json: only with a snapshot file"},
		{[]string{"--device", "0"}, "memplan: --device: only with a snapshot file"},
		{[]string{"--capacity", "1GiB"}, "memplan: --capacity: only with a snapshot file"},
	} {
		var out, errb strings.Builder
		args := append([]string{"diagnose", "--model", "gpt2", "--gpu", "h100"}, c.flags...)
		if rc := Main(args, &out, &errb); rc != 1 || !strings.HasPrefix(errb.String(), c.want) || strings.Count(errb.String(), "\n") != 1 || out.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q, stdout %d bytes; want exit 1 and one line starting %q", c.flags, rc, errb.String(), out.Len(), c.want)
		}
	}
}
