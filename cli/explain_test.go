package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExplainCommand(t *testing.T) {
	var out, errb bytes.Buffer
	png := filepath.Join(t.TempDir(), "t.png")
	code := Main([]string{"explain", "../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle", "--json", "--png", png}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Schema        string `json:"schema"`
		PeakAllocated struct {
			Bytes int64 `json:"bytes"`
		} `json:"peak_allocated"`
		PeakReserved struct {
			Reserved int64 `json:"reserved_bytes"`
		} `json:"peak_reserved"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	// ../shared/snapshots/summaries/MAGMA27_assignment2-systems-15883f2.json
	if rep.Schema != "memplan.explain/v1" || rep.PeakAllocated.Bytes != 13923997700 || rep.PeakReserved.Reserved != 14180941824 {
		t.Errorf("report %+v", rep)
	}
	if st, err := os.Stat(png); err != nil || st.Size() == 0 {
		t.Errorf("no PNG: %v", err)
	}
}

// explain on torch.profiler's memory timeline: the file's own peak
// (14,462,020 bytes at point 25: json.load and max(map(sum, sizes)) on
// testdata/profiler/cpu_mlp_step.json), its categories on the ledger, a plot,
// and --against a plan, which finds no reserved bytes to compare.
func TestExplainTimeline(t *testing.T) {
	var out, errb bytes.Buffer
	svg := filepath.Join(t.TempDir(), "t.svg")
	code := Main([]string{"explain", "../testdata/profiler/cpu_mlp_step.raw.json.gz", "--json", "--svg", svg,
		"--against", "flags", "--model", "gpt2", "--micro-batch", "1", "--seq", "64", "--kernels", "cpu", "--precision", "fp32"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Source        string `json:"source"`
		PeakAllocated struct {
			Bytes      int64 `json:"bytes"`
			Event      int   `json:"event"`
			ByCategory []struct {
				Name  string `json:"name"`
				Bytes int64  `json:"bytes"`
			} `json:"by_category"`
		} `json:"peak_allocated"`
		Against struct {
			Snapshot         int64    `json:"snapshot_peak_bytes"`
			ReservedRelError *float64 `json:"reserved_rel_error"`
		} `json:"against"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	p := rep.PeakAllocated
	if rep.Source != "torch.profiler memory timeline" || p.Bytes != 14462020 || p.Event != 25 || len(p.ByCategory) == 0 || p.ByCategory[0].Name != "activations" {
		t.Errorf("report %+v", rep)
	}
	if rep.Against.Snapshot != 14462020 || rep.Against.ReservedRelError != nil {
		t.Errorf("against %+v", rep.Against)
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("time point")) || bytes.Contains(b, []byte(">reserved<")) {
		t.Errorf("SVG: %v (a timeline's plot has time points and no reserved line)", err)
	}
	out.Reset()
	if code := Main([]string{"explain", "../testdata/profiler/cpu_mlp_step.json"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "AUTOGRAD_DETAIL") {
		t.Errorf("text: exit %d\n%s", code, out.String())
	}
}

// Bad input: one line, exit 1, nothing written.
func TestExplainBadInput(t *testing.T) {
	dir := t.TempDir()
	magma, err := os.ReadFile("../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle")
	if err != nil {
		t.Fatal(err)
	}
	timeline, err := os.ReadFile("../testdata/profiler/cpu_mlp_step.json")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"explain"}, "want one snapshot or memory timeline file"},
		{[]string{"explain", filepath.Join(dir, "missing.pickle")}, "reading snapshot"},
		{[]string{"explain", write("half.pickle", magma[:len(magma)/3])}, "truncated"},
		{[]string{"explain", write("evil.pickle", []byte("cos\nsystem\n(S'touch pwned'\ntR."))}, "global os.system"},
		{[]string{"explain", write("int.pickle", []byte("\x80\x02K\x01."))}, "not a CUDA memory snapshot"},
		{[]string{"explain", write("t.json", []byte(`{"a": 1}`))}, "this is JSON"},
		{[]string{"explain", "../testdata/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl", "--device", "7"}, "--device 7"},
		{[]string{"explain", "../testdata/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl", "--svg", filepath.Join(dir, "x.pdf")}, "want a file name ending in .svg"},
		{[]string{"explain", "../testdata/profiler/cpu_mlp_step.json", "--device", "0"}, "--device: ../testdata/profiler/cpu_mlp_step.json is a torch.profiler memory timeline"},
		{[]string{"explain", write("half.json", timeline[:len(timeline)/2])}, "half.json: not a torch.profiler memory timeline"},
		{[]string{"explain", write("t.html", []byte("<html><body><img src='data:image/png;base64,AA'></body></html>"))}, "an HTML memory timeline holds only a picture"},
		{[]string{"explain", write("neg.json", []byte("[[1], [[0,0,0,0,-1,0,0,0,0]]]"))}, "TEMPORARY is -1 bytes"},
		// Sums past int64 wrapped: a peak of 1 B at point 1, a negative PARAMETER.
		{[]string{"explain", write("wrap.json", []byte("[[0,1],[[0,9000000000000000000,9000000000000000000,0,0,0,0,0,0],[0,1,0,0,0,0,0,0,0]]]"))},
			"wrap.json: time point 0 (0 µs): the live bytes sum past 4 EiB (2^62 bytes)"},
		{[]string{"explain", write("wrap.raw.json", []byte("[[-1,1,4611686018427387904,0],[-1,1,4611686018427387904,0],[-1,1,4,0]]"))},
			"wrap.raw.json: raw event 1 (time point 0): the live bytes of PARAMETER pass 4 EiB"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := Main(c.args, &out, &errb)
		msg := errb.String()
		if code != 1 || !strings.Contains(msg, c.want) || strings.Count(msg, "\n") != 1 || out.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q, stdout %d bytes; want one line with %q", c.args, code, msg, out.Len(), c.want)
		}
	}
	if _, err := os.Stat("pwned"); err == nil {
		t.Fatal("the pickle ran code")
	}
}

// TestPlotFlagsNameTheirFormat: --png draws PNG and --svg SVG, so each
// takes only a file named for its format; a file named for another (plan
// --png a.svg wrote an SVG into it, by its extension) or for none is
// refused in one line that says what the flag takes, and nothing is
// written.
func TestPlotFlagsNameTheirFormat(t *testing.T) {
	dir := t.TempDir()
	at := func(name string) string { return filepath.Join(dir, name) }
	snap := "../testdata/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--model", "gpt2", "--seq", "64", "--png", at("a.svg")}, `--png "` + at("a.svg") + `": want a file name ending in .png (.svg is --svg's)`},
		{[]string{"plan", "--model", "gpt2", "--seq", "64", "--svg", at("b.png")}, `--svg "` + at("b.png") + `": want a file name ending in .svg (.png is --png's)`},
		{[]string{"plan", "--model", "gpt2", "--seq", "64", "--svg", at("c.pdf")}, `--svg "` + at("c.pdf") + `": want a file name ending in .svg`},
		{[]string{"explain", snap, "--png", at("noext")}, `--png "` + at("noext") + `": want a file name ending in .png`},
		{[]string{"explain", snap, "--svg", at("d.png")}, `--svg "` + at("d.png") + `": want a file name ending in .svg (.png is --png's)`},
		{[]string{"explain", snap, "--svg", at("x.pdf")}, `--svg "` + at("x.pdf") + `": want a file name ending in .svg`},
		{[]string{"pack", "../testdata/pack/mix.yaml", "--gpus", "2xh100", "--png", at("e.svg")}, `--png "` + at("e.svg") + `": want a file name ending in .png (.svg is --svg's)`},
	} {
		code, out, errs := run(c.args...)
		if code != ExitBadInput || out != "" || errs != "memplan: "+c.want+"\n" {
			t.Errorf("%s: exit %d, stdout %d bytes, stderr %q; want %q", strings.Join(c.args, " "), code, len(out), errs, c.want)
		}
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("refused plots left %d files behind", len(left))
	}
	// A name of the flag's format in any case is taken.
	if code, _, errs := run("plan", "--model", "gpt2", "--seq", "64", "--svg", at("ok.SVG"), "--png", at("ok.png")); code != 0 {
		t.Errorf("plan --svg ok.SVG --png ok.png: exit %d, %q", code, errs)
	}
	for _, name := range []string{"ok.SVG", "ok.png"} {
		b, err := os.ReadFile(at(name))
		if err != nil {
			t.Fatal(err)
		}
		if isPNG := bytes.HasPrefix(b, []byte("\x89PNG")); isPNG != strings.HasSuffix(name, ".png") {
			t.Errorf("%s: PNG %v", name, isPNG)
		}
	}
}

// TestExplainWritesNothingWhenItFails: every flag, --against's plan
// included, is checked before a plot is written, so a refused explain
// leaves no --png or --svg file behind (they were written first, then
// --against failed).
func TestExplainWritesNothingWhenItFails(t *testing.T) {
	snap := "../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle"
	for _, c := range []struct {
		tail []string
		want string
	}{
		{[]string{"--against", "/nonexistent.json"}, "--against"},
		{[]string{"--against", "flags", "--model", "nope"}, "--model \"nope\""},
		{[]string{"--against", "flags", "--micro-batch", "0"}, "--micro-batch must be at least 1"},
	} {
		dir := t.TempDir()
		args := append([]string{"explain", snap, "--png", filepath.Join(dir, "e1.png"), "--svg", filepath.Join(dir, "e1.svg")}, c.tail...)
		code, out, errs := run(args...)
		if code != ExitBadInput || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want one line with %q", c.tail, code, len(out), errs, c.want)
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("%v: left %v behind", c.tail, left)
		}
	}
}

// TestSnapshotPathsTakeNoPlanFlags: explain reads the plan flags only to
// plan with --against flags, and diagnose SNAPSHOT only --gpu (the device
// to replay on); any other plan flag given there is refused by name, not
// ignored (explain SNAPSHOT --model nope --micro-batch 0 answered as if
// they were not given, diagnose SNAPSHOT --gpu t4 asked for --capacity).
func TestSnapshotPathsTakeNoPlanFlags(t *testing.T) {
	snap := "../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"explain", snap, "--model", "nope"}, "--model applies only with --against flags"},
		{[]string{"explain", snap, "--model", "nope", "--micro-batch", "0", "--gpu", "bogus", "--budget", "xyz"}, "--budget applies only with --against flags"},
		{[]string{"explain", snap, "--against", "/nonexistent.json", "--seq", "128"}, "--seq applies only with --against flags"},
		{[]string{"explain", snap, "--recipe", "deepspeed", "--json"}, "--recipe applies only with --against flags"},
		{[]string{"diagnose", snap, "--capacity", "12GiB", "--model", "nope", "--gpu", "bogus", "--reserved"},
			"--model does not apply to a snapshot (diagnose SNAPSHOT takes --capacity or --gpu, --device and --json)"},
		{[]string{"diagnose", snap, "--reserved"}, "--reserved does not apply to a snapshot"},
		{[]string{"diagnose", snap, "--set", "cuda.overhead=0"}, "--set does not apply to a snapshot"},
		{[]string{"diagnose", snap, "--capacity", "12GiB", "--gpu", "t4"}, "give --capacity or --gpu, not both"},
		{[]string{"diagnose", snap, "--gpu", "bogus"}, "--gpu \"bogus\": not a GPU of the catalog"},
		{[]string{"diagnose", snap}, "give --capacity or --gpu"},
	} {
		code, out, errs := run(c.args...)
		if code != ExitBadInput || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want one line with %q", c.args[2:], code, len(out), errs, c.want)
		}
	}
	// --gpu is the device less the CUDA context plan counts: the run fits
	// a t4's (exit 0, one line), and (13.2 GiB reserved at its peak) runs
	// out on a 10 GB MIG slice (exit 3, the report).
	if code, out, errs := run("diagnose", snap, "--gpu", "t4"); code != 0 || !strings.Contains(out, snap+" fits in 14.38 GiB (--gpu t4: its memory less the CUDA context)") {
		t.Errorf("diagnose --gpu t4: exit %d, %q %q", code, out, errs)
	}
	code, out, errs := run("diagnose", snap, "--gpu", "a100-80gb-mig-1g.10gb", "--json")
	var got struct {
		Capacity int64  `json:"capacity_bytes"`
		Phase    string `json:"phase"`
	}
	if code != ExitDoesNotFit || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("diagnose --gpu a100-80gb-mig-1g.10gb: exit %d, %q", code, errs)
	}
	if want := int64(10200547328) - 400_000_000; got.Capacity != want || got.Phase != "forward" {
		t.Errorf("capacity %d (want %d), phase %q", got.Capacity, want, got.Phase)
	}
	// With --against flags, explain plans with them.
	if code, _, errs := run("explain", snap, "--against", "flags", "--model", "gpt2", "--seq", "128"); code != 0 {
		t.Errorf("explain --against flags --model gpt2: exit %d, %q", code, errs)
	}
}
