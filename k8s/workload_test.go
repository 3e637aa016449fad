package k8s

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/memplan/memplan/units"
)

func TestParseWorkloadBadInput(t *testing.T) {
	refs := t.TempDir()
	os.WriteFile(filepath.Join(refs, "bad-plan.json"), []byte(`{"schema": "nope"}`), 0o644)
	os.WriteFile(filepath.Join(refs, "bad-snap.pickle"), []byte("not a pickle"), 0o644)
	cfg, _ := filepath.Abs("../testdata/torch/gpt2_tiny.config.json")
	tiny, _ := os.ReadFile(cfg)
	os.WriteFile(filepath.Join(refs, "tiny.json"), tiny, 0o644)
	for _, c := range []struct{ in, refs, want string }{
		{"", "", "empty"},
		{"   ", "", "empty"},
		{"[1, 2]", "", "want a mapping"},
		{"42", "", "want a mapping"},
		{"train: {model: gpt2", "", "not YAML or JSON"},
		{"{name: x, train: {model: gpt2}}", "", "name is the pod's"},
		{"{replicas: 2, train: {model: gpt2}}", "", "replicas: a pod is one process"},
		{"{}", "", "give exactly one of train, serve"},
		{"train: {model: gpt2, micro-batch: four}", "", "micro-batch"},
		{"train: {model: gpt2, colour: red}", "", `train: unknown key "colour"`},
		{"train: {Model: /etc/passwd}", "", `: train: unknown key "Model" (keys are written as documented: model)`},
		{"Plan: /etc/passwd", refs, `: unknown key "Plan"`},
		{"{Name: x, train: {model: gpt2}}", "", `: unknown key "Name"`},
		{"{train: {model: gpt2}, serve: {model: gpt2, concurrency: 1, context: 8}}", "", ""},
		{"published: rows.jsonl#A", "", "a published row is for job files"},
		{"plan: p.json", "", "no reference directory"},
		{"plan: ../../etc/passwd", refs, "inside the reference directory"},
		{"plan: /etc/passwd", refs, "inside the reference directory"},
		{"plan: missing.json", refs, "no such file"},
		{"plan: bad-plan.json", refs, "plan bad-plan.json"},
		{"snapshot: bad-snap.pickle", refs, "snapshot bad-snap.pickle"},
		{strings.Repeat("x", maxAnnotation+1), "", "longer than"},
		// The extender plans catalog models and embedded recipes: a path
		// in model: or recipe: is refused before anything is read, on
		// its disk or under --refs.
		{"train: {model: /etc/passwd}", "", `train.model "/etc/passwd": the extender plans catalog models`},
		{"train: {model: CFG, seq: 64}", "", "train.model"},
		{"train: {model: tiny.json, seq: 64}", refs, `train.model "tiny.json": the extender plans catalog models`},
		{"serve: {model: ../../etc/config.json, concurrency: 1, context: 8}", refs, `serve.model "../../etc/config.json"`},
		{"serve: {model: /, concurrency: 1, context: 8}", "", `serve.model "/"`},
		{`train: {model: 'C:\\models\\config.json'}`, "", "train.model"},
		{"train: {model: gpt5}", "", `train.model "gpt5": the extender plans catalog models`},
		{"train: {model: gpt2, recipe: /etc/recipe.yaml}", "", `train.recipe "/etc/recipe.yaml": the extender takes the recipes`},
		{"train: {model: gpt2, recipe: tiny.json}", refs, `train.recipe "tiny.json"`},
		{"serve: {model: gpt2, concurrency: 1, context: 8, server: hf, recipe: ./r.yaml}", "", `serve.recipe "./r.yaml"`},
		// Aliases may expand the annotation to what an annotation may
		// hold (5,000 aliases of a string took the extender to 3.7 GB,
		// then to "larger than 16.00 MiB"); keys must be strings.
		{"{big: &a \"" + strings.Repeat("x", 200) + "\", refs: [" + strings.Repeat("*a,", 5000) + "*a]}", "", ": YAML aliases expand to more than 256 KiB"},
		{"serve: {model: llama-3-70b, concurrency: 1048576, context: 8192}", "", "serve: concurrency 1048576 is more than the 8192 tokens vLLM schedules in one step at max-model-len 8192"},
		{"?", "", ": a mapping key must be a string (line 1)"},
		{"{train: {model: gpt2, ? [x] : 1}}", "", ": a mapping key must be a string (line 1)"},
		{"train:\n  model: gpt2\n  ~: 1\n", "", ": a mapping key must be a string (line 3)"},
	} {
		c.in = strings.ReplaceAll(c.in, "CFG", cfg)
		_, err := ParseWorkload(c.in, "team-a/p", c.refs)
		if err == nil {
			t.Errorf("%.60q: no error", c.in)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "pod team-a/p: annotation memplan.io/workload: ") || !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("%.60q: %q, want %q", c.in, msg, c.want)
		}
		checkMsg(t, msg)
	}
}

func TestParseWorkloadKinds(t *testing.T) {
	for _, in := range []string{
		xl,
		`{"serve": {"model": "llama-3-8b", "concurrency": 32, "context": 2048}}`,
		"serve: {model: qwen2.5-7b, concurrency: 8, context: 1024, server: hf}\nrequest: 20GiB",
		// A catalog model by its repository, which has a slash, and an
		// embedded recipe.
		"train: {model: openai-community/gpt2, recipe: torchtune, seq: 128}",
	} {
		w, err := ParseWorkload(in, "ns/p", "")
		if err != nil || w.Job.Name != "ns/p" {
			t.Errorf("%q: %v", in, err)
		}
	}
	a, _ := ParseWorkload(xl, "ns/a", "")
	b, _ := ParseWorkload("{train: {model: gpt2-xl, micro-batch: 4, seq: 1024, precision: amp-bf16, checkpoint: full}}", "ns/b", "")
	c, _ := ParseWorkload("{train: {model: gpt2-xl, micro-batch: 8, seq: 1024, precision: amp-bf16, checkpoint: full}}", "ns/c", "")
	if a.key != b.key || a.key == c.key {
		t.Error("the cache key should be the job, not the pod or the spelling")
	}
}

func node(labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: labels}}
}

func TestGPUsOfBadInput(t *testing.T) {
	for _, c := range []struct {
		labels map[string]string
		want   string
	}{
		{nil, "node has no nvidia.com/gpu.product label"},
		{map[string]string{ProductLabel: "NVIDIA-Quadro-K620", CountLabel: "1"}, "label nvidia.com/gpu.product=NVIDIA-Quadro-K620 names no GPU of memplan's catalog"},
		{map[string]string{ProductLabel: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", CountLabel: "7"}, "is a MIG device"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3"}, "no nvidia.com/gpu.count label"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "eight"}, "label nvidia.com/gpu.count=eight is not a GPU count"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "0"}, "is not a GPU count"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "-2"}, "is not a GPU count"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "100000"}, "is not a GPU count"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "8", MemoryLabel: "0"}, "label nvidia.com/gpu.memory=0 is not a GPU memory in MiB between 1 and "},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "8", MemoryLabel: "-5"}, "label nvidia.com/gpu.memory=-5 is not a GPU memory"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "8", MemoryLabel: "999999999999"}, "label nvidia.com/gpu.memory=999999999999 is not a GPU memory"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "8", MemoryLabel: "81559.5"}, "is not a GPU memory"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "8", MemoryLabel: "80GiB"}, "is not a GPU memory"},
		{map[string]string{ProductLabel: "NVIDIA-H100-80GB-HBM3", CountLabel: "8", MemoryLabel: ""}, "label nvidia.com/gpu.memory= is not a GPU memory"},
	} {
		_, err := GPUsOf(node(c.labels))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.labels, err, c.want)
			continue
		}
		checkMsg(t, err.Error())
	}
}

// GFD's product names (the NVML name, spaces as dashes; -SHARED when
// time-sliced) resolve to the catalog.
func TestGPUsOfProducts(t *testing.T) {
	for label, want := range map[string]string{
		"NVIDIA-H100-80GB-HBM3":        "h100-sxm",
		"NVIDIA-H100-80GB-HBM3-SHARED": "h100-sxm",
		"NVIDIA-A100-SXM4-80GB":        "a100-80gb",
		"NVIDIA-A100-SXM4-40GB":        "a100-40gb",
		"Tesla-T4":                     "t4",
		"NVIDIA-L4":                    "l4",
		"NVIDIA-H200":                  "h200",
	} {
		g, err := GPUsOf(node(map[string]string{ProductLabel: label, CountLabel: "8"}))
		if err != nil || g.GPU.Name != want || g.Count != 8 {
			t.Errorf("%s: %v %v, want %s", label, g.GPU, err, want)
		}
	}
}

// The memory GFD writes (NVML's total in MiB, over what CUDA lets a
// process allocate) passes on the catalog's largest GPUs.
func TestGPUsOfMemoryLabel(t *testing.T) {
	for label, mib := range map[string]string{
		"NVIDIA-H100-80GB-HBM3": "81559",
		"NVIDIA-A100-SXM4-80GB": "81920",
		"NVIDIA-H200":           "143771",
		"NVIDIA-B200":           "183359",
		"Tesla-T4":              "15360",
	} {
		if _, err := GPUsOf(node(map[string]string{ProductLabel: label, CountLabel: "8", MemoryLabel: mib})); err != nil {
			t.Errorf("%s with %s MiB: %v", label, mib, err)
		}
	}
	if top := maxMemoryMiB(); top < 183359 || top > 1<<20 {
		t.Errorf("largest GPU memory %d MiB", top)
	}
}

func TestPlace(t *testing.T) {
	const G = units.GiB
	c := 80 * G
	for _, c0 := range []struct {
		name   string
		count  int
		whole  int64
		margin units.Bytes
		procs  []Proc
		need   units.Bytes
		fits   bool
		gpu    int
		used   units.Bytes
		reason string
	}{
		{"empty node", 2, 0, 0, nil, 30 * G, true, 0, 30 * G, ""},
		{"best fit", 3, 0, 0, []Proc{{"a", 20 * G, 0}, {"b", 40 * G, 1}}, 30 * G, true, 1, 70 * G, ""},
		{"pinned full", 1, 0, 0, []Proc{{"a", 60 * G, 0}}, 30 * G, false, -1, 0, "the most any of its 1 free GPUs has left is 20.00 GiB"},
		{"margin", 1, 0, 10 * G, []Proc{{"a", 40 * G, 0}}, 30 * G, true, 0, 70 * G, ""},
		{"margin refuses", 1, 0, 11 * G, []Proc{{"a", 40 * G, 0}}, 30 * G, false, -1, 0, "left is 29.00 GiB"},
		{"unpinned first-fit decreasing", 2, 0, 0, []Proc{{"a", 30 * G, -1}, {"b", 50 * G, -1}, {"c", 30 * G, -1}}, 20 * G, true, 1, 50 * G, ""},
		{"whole GPUs held", 2, 1, 0, []Proc{{"a", 70 * G, 0}}, 20 * G, false, -1, 0, "1 free GPUs"},
		{"all whole", 2, 2, 0, nil, 1, false, -1, 0, "all 2 GPUs are held whole by pods that limit nvidia.com/gpu"},
		{"overcommitted already", 1, 0, 0, []Proc{{"a", 50 * G, -1}, {"b", 50 * G, -1}}, G, false, -1, 0, "left is 0 B"},
	} {
		p := Place(c, c0.count, c0.whole, c0.margin, c0.procs, c0.need)
		if p.Fits != c0.fits || p.GPU != c0.gpu || (c0.fits && p.Used != c0.used) || !strings.Contains(p.Reason, c0.reason) {
			t.Errorf("%s: %+v", c0.name, p)
		}
	}
}

func TestWholeGPUs(t *testing.T) {
	q := func(n int64) corev1.ResourceList {
		return corev1.ResourceList{GPUResource: *resource.NewQuantity(n, resource.DecimalSI)}
	}
	p := &corev1.Pod{Spec: corev1.PodSpec{
		Containers:     []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: q(2)}}, {Resources: corev1.ResourceRequirements{Limits: q(1)}}},
		InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Limits: q(4)}}},
	}}
	if n := wholeGPUs(p); n != 4 {
		t.Errorf("%d, want 4 (the init container's)", n)
	}
}

// FuzzParseWorkload: any annotation either parses into a job named after
// the pod or fails with one line naming the annotation; never a panic.
func FuzzParseWorkload(f *testing.F) {
	for _, s := range []string{xl, "serve: {model: llama-3-8b, concurrency: 32, context: 2048}", "{}", "[", "plan: x.json", "train: {model: gpt2, set: [a=b]}", "request: 1GiB\ntrain: {model: gpt2}", "train: {Model: gpt2}",
		"{t: &t {model: gpt2, seq: 64}, train: *t}", "{big: &a \"xxxxxxxx\", refs: [*a, *a, *a, *a]}", "?", "? [a]\n: 1", "train: &t {model: gpt2, x: *t}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseWorkload(s, "ns/p", "")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "pod ns/p: annotation memplan.io/workload: ") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%q", err)
			}
			return
		}
		if w.Job.Name != "ns/p" || w.key == "" {
			t.Fatalf("%+v", w.Job)
		}
	})
}
