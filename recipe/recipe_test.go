package recipe

import (
	"errors"
	"github.com/memplan/memplan/internal/msgcheck"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// Every embedded recipe parses, names a framework and a version, and cites
// a source for every switch it sets.
func TestEmbeddedRecipes(t *testing.T) {
	rs, err := List()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"deepspeed", "hf", "hf5", "litgpt", "megatron", "pytorch", "torchtitan", "torchtune"}
	if got := Names(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("recipes %v, want %v", got, want)
	}
	for _, r := range rs {
		if r.Framework == "" || r.Version == "" || r.Doc == "" {
			t.Errorf("%s: framework, version and doc are required", r.Name)
		}
		for _, st := range r.Settings {
			if len(st.Source) < 20 {
				t.Errorf("%s: %s=%s cites no source", r.Name, st.Key, st.Value)
			}
		}
		var s engine.Spec
		if err := r.Apply(&s, nil); err != nil {
			t.Errorf("%s: %v", r.Name, err)
		}
	}
}

func TestBadInput(t *testing.T) {
	r, err := Load("litgpt")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ kv, want string }{
		{"nonsense", `recipe setting "nonsense": want key=value`},
		{"=true", `"=true": want key=value`},
		{"lora.drop=shared", `unknown switch "lora.drop" (switches: precision, optimizer`},
		{"lora.dropout=twice", `lora.dropout="twice": want per-target or shared (allowed: per-target, shared)`},
		{"precision=fp8", `precision="fp8"`},
		{"bitsandbytes=latest", "want a version such as 0.41.1"},
		{"cuda.overhead=-5", "want a byte size"},
		{"loss=chunked:tokens=0", "tokens must be a positive integer"},
		{"loss=chunked:rows=-1", "rows must be a positive integer"},
		{"loss=chunked:lines=8", `unknown key "lines" (want tokens=N, chunks=N, rows=N, fp32 or fp32-outputs)`},
		{"loss=chunked:chunks=8,fp32,fp32-outputs", "fp32 and fp32-outputs contradict"},
		{"loss=chunked:chunks=8,tokens=16", "chunks=8 and tokens=16 contradict"},
		{"loss=chunked:chunks=8,chunks=4", "chunks is given twice"},
		{"loss=chunkedtokens=4", `unknown loss "chunkedtokens=4" (want fp32-logits, native, fused-linear, or chunked[:OPTIONS]`},
		{"loss=chunked:foo", `unknown key "foo"`},
		{"optimizer.paged=maybe", "want true or false"},
	} {
		err := r.Clone().Set(c.kv)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--set %s: error %v, want it to contain %q", c.kv, err, c.want)
		}
		if err != nil {
			if p := msgcheck.Problems(err.Error()); p != nil {
				t.Errorf("--set %s: %q: %v", c.kv, err, p)
			}
		}
	}
	if _, err := Load("litgtp"); err == nil || !strings.Contains(err.Error(), "recipes: deepspeed, hf, hf5, litgpt") {
		t.Errorf("unknown recipe: %v", err)
	}
	dir := t.TempDir()
	for name, body := range map[string]string{
		"noname.yaml":  "framework: x\n",
		"badkey.yaml":  "name: x\nswitches:\n- key: lora.rank\n  value: \"8\"\n",
		"badval.yaml":  "name: x\nswitches:\n- key: precision\n  value: fp4\n",
		"unknown.yaml": "name: x\nflavour: y\n",
		"notyaml.yaml": "name: [x\n",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: want a one-line error naming the file, got %v", name, err)
		}
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}

// A recipe file's aliases may expand it to what a recipe file may hold, and
// its keys are strings; each refusal is one line naming the file.
func TestParseYAMLRefusals(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"name: x\ndoc: &d \"" + strings.Repeat("x", 64<<10) + "\"\nframework: [" + strings.Repeat("*d,", 20) + "*d]\n", "r.yaml: YAML aliases expand to more than 1 MiB"},
		{"?\n", "r.yaml: a mapping key must be a string (line 1)"},
		{"name: x\nswitches:\n- {key: precision, ? [v]: fp32}\n", "r.yaml: a mapping key must be a string (line 3)"},
		// A switch set twice: the last would win unseen.
		{"name: x\nswitches:\n- {key: precision, value: pure-bf16}\n- {key: optimizer, value: sgd}\n- {key: precision, value: fp32}\n", "r.yaml: switch 3 sets precision again (switch 1 set it)"},
	} {
		_, err := Parse([]byte(c.in), "r.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%.40q: %v, want one line containing %q", c.in, err, c.want)
			continue
		}
		if p := msgcheck.Problems(err.Error()); p != nil {
			t.Errorf("%q: %v", err, p)
		}
	}
}

// A flag the user gave wins over the recipe; a --set of its switch must
// agree with it (in any spelling), else neither wins; without the flag,
// --set wins over the recipe.
func TestApplyOrder(t *testing.T) {
	r, _ := Load("litgpt")
	r = r.Clone()
	s := engine.Spec{Job: engine.Job{Precision: ops.AMPBF16}}
	precisionGiven := func(flag string) bool { return flag == "precision" }
	if err := r.Apply(&s, precisionGiven); err != nil {
		t.Fatal(err)
	}
	if s.Precision != ops.AMPBF16 {
		t.Errorf("explicit --precision overridden by the recipe: %v", s.Precision)
	}
	agree := r.Clone()
	if err := agree.Set("precision=bf16-mixed"); err != nil {
		t.Fatal(err)
	}
	if err := agree.Apply(&s, precisionGiven); err != nil || s.Precision != ops.AMPBF16 {
		t.Errorf("--set precision=bf16-mixed beside --precision amp-bf16: %v, %v", err, s.Precision)
	}
	if err := r.Set("precision=fp32"); err != nil {
		t.Fatal(err)
	}
	var d *Disagreement
	if err := r.Apply(&s, precisionGiven); !errors.As(err, &d) || *d != (Disagreement{Flag: "precision", Key: "precision", Value: "fp32"}) || !errors.Is(err, ErrRecipe) {
		t.Errorf("--set precision=fp32 beside --precision amp-bf16: %v", err)
	}
	s = engine.Spec{}
	if err := r.Apply(&s, nil); err != nil || s.Precision != ops.FP32 {
		t.Errorf("--set precision=fp32 without the flag: %v, %v", err, s.Precision)
	}
	s = engine.Spec{}
	if err := r.Apply(&s, nil); err != nil {
		t.Fatal(err)
	}
	if s.Sem.Hold != lower.HoldNextForward || !s.Sem.LoRAModelDType || !s.Sem.Quant.SavesInput || !s.Sem.FSDPFlat {
		t.Errorf("litgpt semantics not applied: %+v", s.Sem)
	}
}

func TestVersionBefore(t *testing.T) {
	for _, c := range []struct {
		v    string
		want bool
	}{{"0.41.1", true}, {"0.43.2", true}, {"0.43.3", false}, {"0.44", false}, {"v0.42.0", true}, {"1.0.0", false}, {"0.43.3.dev0", false}, {"0.43.2+cu121", true}} {
		got, err := versionBefore(c.v, [3]int{0, 43, 3})
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.v, got, err, c.want)
		}
	}
	for _, v := range []string{"", "x.y", "1", "0.1234567.0"} {
		if _, err := versionBefore(v, [3]int{0, 43, 3}); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, n := range Names() {
		data, err := embedded.ReadFile("recipes/" + n + ".yaml")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("name: x\nswitches:\n- key: loss\n  value: chunked:tokens=99999999999\n"))
	for _, loss := range []string{"chunked:chunks=8,fp32,fp32-outputs", "chunked:chunks=8,tokens=16", "chunked:chunks=8,chunks=4", "chunkedtokens=4", "chunked:", "chunked:rows=128,fp32-outputs"} {
		f.Add([]byte("name: x\nswitches:\n- key: loss\n  value: " + loss + "\n"))
	}
	f.Add([]byte("name: x\nswitches:\n- &s {key: precision, value: fp32, source: a}\n- *s\n- *s\n"))
	f.Add([]byte("name: &n x\ndoc: [*n, *n, *n, *n]\nswitches: []\n"))
	f.Add([]byte("?\n"))
	f.Add([]byte("name: x\n? [a]\n: 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse(data, "f.yaml")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		var s engine.Spec
		if err := r.Apply(&s, nil); err != nil {
			t.Fatalf("a parsed recipe does not apply: %v", err)
		}
	})
}
