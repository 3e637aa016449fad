package models

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var requiredCatalog = []string{
	"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-2-7b", "llama-2-13b",
	"llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.2-1b",
	"mistral-7b", "qwen2.5-0.5b", "qwen2.5-7b", "qwen3-8b", "gemma-2b", "gemma-7b",
	"gemma-2-9b", "phi-3-mini", "pythia-160m", "pythia-1.4b", "mixtral-8x7b",
	"bert-base", "bert-large", "vit-base", "tinyllama-1.1b", "phi-1.5",
	"phi-2", "qwen3-30b-a3b", "gemma-3-1b", "falcon-7b",
}

func TestCatalogComplete(t *testing.T) {
	names := Names()
	if !sort.StringsAreSorted(names) {
		t.Errorf("Names not sorted: %v", names)
	}
	have := map[string]bool{}
	for _, n := range names {
		have[n] = true
		if _, ok := catalogRepos[n]; !ok {
			t.Errorf("%s: no source repository in catalogRepos", n)
		}
	}
	for _, n := range requiredCatalog {
		if !have[n] {
			t.Errorf("catalog lacks %s", n)
		}
	}
	for n := range catalogRepos {
		if !have[n] {
			t.Errorf("catalogRepos names %s, which has no catalog file", n)
		}
	}
}

func TestCatalogEntries(t *testing.T) {
	for _, e := range Catalog() {
		if e.Params <= 0 || e.Family == "" || e.Repo == "" {
			t.Errorf("bad entry %+v", e)
		}
		if !strings.HasPrefix(e.Description, e.Family+", ") || strings.Contains(e.Description, "\n") {
			t.Errorf("description %q", e.Description)
		}
	}
	a, _ := Lookup("llama-2-7b")
	if got, want := a.Describe(), "llama, 6.74B params, 32 layers, d=4096, 32 heads, ffn 11008, vocab 32000"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	m, _ := Lookup("mixtral-8x7b")
	if got := m.Describe(); !strings.Contains(got, "46.7B params") || !strings.Contains(got, "8 experts top-2") || !strings.Contains(got, "(8 kv)") {
		t.Errorf("Describe = %q", got)
	}
}

func TestLookupCaseAndRepo(t *testing.T) {
	for _, n := range []string{"Llama-2-7B", " llama-2-7b ", "meta-llama/Llama-2-7b-hf", "META-LLAMA/LLAMA-2-7B-HF"} {
		a, err := Lookup(n)
		if err != nil {
			t.Errorf("Lookup(%q): %v", n, err)
			continue
		}
		if a.Name != "llama-2-7b" {
			t.Errorf("Lookup(%q).Name = %q", n, a.Name)
		}
	}
	// Each Lookup returns an independent value.
	a, _ := Lookup("gpt2")
	a.Layers = 1
	b, _ := Lookup("gpt2")
	if b.Layers != 12 {
		t.Error("Lookup shares state between calls")
	}
}

func TestLookupSuggestions(t *testing.T) {
	cases := []struct {
		in   string
		want []string // expected suggestions, in order
	}{
		{"lama-2-7b", []string{"llama-2-7b", "llama-2-70b", "llama-2-13b"}},
		{"gpt-2", []string{"gpt2"}},
		{"mistral", []string{"mistral-7b"}},
		{"QWEN3", []string{"qwen3-30b-a3b", "qwen3-8b"}},
		{"bert", []string{"bert-base"}},
	}
	for _, c := range cases {
		_, err := Lookup(c.in)
		if err == nil {
			t.Fatalf("Lookup(%q) succeeded", c.in)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, `unknown model "`+c.in+`"; did you mean `) || !strings.HasSuffix(msg, "?") {
			t.Errorf("error %q", msg)
		}
		got := Suggest(c.in, 3)
		if len(got) != 3 {
			t.Errorf("Suggest(%q) = %v, want 3 names", c.in, got)
		}
		for i, w := range c.want {
			if i >= len(got) || got[i] != w {
				t.Errorf("Suggest(%q) = %v, want prefix %v", c.in, got, c.want)
				break
			}
		}
		if !strings.Contains(msg, strings.Join(got, ", ")) {
			t.Errorf("error %q does not list %v", msg, got)
		}
	}
	if got := Suggest("x", 100); len(got) != len(Names()) {
		t.Errorf("Suggest(n > catalog) = %d names", len(got))
	}
	if got := Suggest("x", -1); len(got) != 0 {
		t.Errorf("Suggest(-1) = %v", got)
	}
}

func TestHumanCount(t *testing.T) {
	for n, want := range map[int64]string{
		999: "999", 1500: "1.50K", 124_439_808: "124M", 6_738_415_616: "6.74B",
		13_015_864_320: "13.0B", 46_702_792_704: "46.7B", 70_553_706_496: "70.6B",
		1_557_611_200: "1.56B", 86_567_656: "86.6M",
	} {
		if got := HumanCount(n); got != want {
			t.Errorf("HumanCount(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestResolveSnapshotDir: a Hugging Face snapshot directory resolves to its
// config.json (named by the directory); a directory without one, or with a
// config.json that is not one, is one line naming the directory or file.
func TestResolveSnapshotDir(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "models--meta-llama--Meta-Llama-3-8B", "snapshots", "abc123")
	if err := os.MkdirAll(good, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("catalog/llama-3-8b.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(good, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := Resolve(good)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Lookup("llama-3-8b")
	if a.Name != good || a.ParamCount() != want.ParamCount() {
		t.Errorf("snapshot: %s with %d parameters, want %s with %d", a.Name, a.ParamCount(), good, want.ParamCount())
	}
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "broken")
	if err := os.MkdirAll(filepath.Join(broken, "config.json"), 0o755); err != nil { // a directory named config.json
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "config.json"), []byte(`{"model_type": "mamba"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, text string }{
		{empty, empty + ": no config.json in this directory"},
		{broken, broken + ":"},
		{bad, filepath.Join(bad, "config.json") + `: unsupported model_type "mamba"`},
	} {
		_, err := Resolve(c.path)
		if err == nil || !strings.HasPrefix(err.Error(), c.text) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line starting %q", c.path, err, c.text)
		}
	}
}

// A catalog name is the catalog's model even where a file or directory of
// that name is in the working directory: the service and the extender
// resolve callers' names, and a name must not read their disk. ./NAME
// reads the path.
func TestResolveNameBeforeDisk(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("gpt2", []byte(`not a config`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir("llama-3-8b", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpt2", "llama-3-8b", "openai-community/gpt2"} {
		if !InCatalog(name) {
			t.Fatalf("%s is not in the catalog", name)
		}
		if _, err := Resolve(name); err != nil {
			t.Errorf("%s: %v, want the catalog's model", name, err)
		}
	}
	if _, err := Resolve("./gpt2"); err == nil {
		t.Errorf("./gpt2 resolved; want the file read (and refused)")
	}
	if InCatalog("./gpt2") || InCatalog("no-such-model") {
		t.Errorf("InCatalog takes a path or an unknown name")
	}
}
