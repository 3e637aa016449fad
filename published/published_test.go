package published

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

const devSet = "../testdata/published/published.jsonl"

// TestDevelopmentSet is issue 9's bar on the development set
// (testdata/published: litgpt's 2023 resource tables, Lightning-AI/litgpt
// tutorials/resource-tables.md @0cc02afa; HF's bert-large study; torchtitan's
// Llama 3.1 8B benchmark): allocated-type rows within a median |error| of
// 3% and a worst of 10%, every oom row predicted not to fit, and every row
// either predicted or listed with the capability it lacks.
//
// The reserved-type and nvidia-smi rows (HF's bert-large nvidia-smi rows;
// torchtitan's max_memory_reserved rows, which lack FSDP2's stream pools)
// are held to the errors this commit measured, rounded up (README "Against
// published GPU measurements": median 8.3%, worst 13.1% over the nine
// nvidia-smi rows), so a change that worsens them fails here.
func TestDevelopmentSet(t *testing.T) {
	rows, err := ReadFile(devSet)
	if err != nil {
		t.Fatal(err)
	}
	var res []Result
	for i := range rows {
		r := Predict(&rows[i], "../testdata/published")
		if r.Err != "" {
			t.Errorf("%s: planning error %s", r.ID, r.Err)
		}
		if r.Predicted == 0 && len(r.Lacks) == 0 {
			t.Errorf("%s: neither predicted nor listed as lacking", r.ID)
		}
		for _, l := range r.Lacks {
			if l.Field == "" || l.Capability == "" {
				t.Errorf("%s: a lack without field or capability: %+v", r.ID, l)
			}
		}
		if r.Compared() {
			t.Logf("%-40s measured %12d predicted %12d %+6.2f%%", r.ID, r.Measured, r.Predicted, 100**r.RelError)
		}
		res = append(res, r)
	}
	s := Summarize(res)
	t.Logf("summary: %+v", s)
	if s.Compared < 20 {
		t.Errorf("only %d allocated-type rows compared", s.Compared)
	}
	if s.Median > 0.03 || s.Worst > 0.10 {
		t.Errorf("median |error| %.2f%%, worst %.2f%% (%s): want <= 3%% and <= 10%%", 100*s.Median, 100*s.Worst, s.WorstID)
	}
	if s.OOMPredicted == 0 || s.OOMRight != s.OOMPredicted {
		t.Errorf("%d of %d oom rows predicted not to fit", s.OOMRight, s.OOMPredicted)
	}
	// Rows whose peak depends on batch lengths the source does not give
	// (litgpt's FSDP rows: the longest sample is forced into the first
	// micro-step only) are predicted as a range that must hold the
	// measurement.
	if s.BoundsHold != s.Bounds {
		t.Errorf("%d of %d ranges hold their measurement", s.BoundsHold, s.Bounds)
	}
	if s.ReservedCompared < 9 || s.ReservedMedian > 0.09 || s.ReservedWorst > 0.14 {
		t.Errorf("reserved and nvidia-smi rows: %d compared, median |error| %.2f%%, worst %.2f%% (%s): want >= 9, <= 9%% and <= 14%%",
			s.ReservedCompared, 100*s.ReservedMedian, 100*s.ReservedWorst, s.ReservedWorstID)
	}
	if s.Compared+s.ReservedCompared+s.Bounds+s.OOMPredicted+s.Lacking != s.Rows {
		t.Errorf("rows unaccounted for: %+v", s)
	}
}

func TestReadRefusesBadInput(t *testing.T) {
	good := `{"schema":"memplan.published/v1","id":"x","framework":"litgpt","model":{"name":"llama-2-7b"},"gpu":"a100-40gb","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":128,"accum":1,"precision":"bf16-true","optimizer":"torch.optim.AdamW","activation_checkpointing":"none","metric":"max_memory_allocated","measured":1.5,"unit":"GB","outcome":"ok"}`
	if _, err := Read(strings.NewReader(good), "f.jsonl"); err != nil {
		t.Fatalf("good row refused: %v", err)
	}
	// Saved with a UTF-8 byte order mark: "invalid character 'ï'".
	if _, err := Read(strings.NewReader("\xef\xbb\xbf"+good), "f.jsonl"); err != nil {
		t.Errorf("a BOM before the first row: %v", err)
	}
	for _, c := range []struct{ in, want string }{
		{"", "no rows"},
		{"{", "f.jsonl:1: not a JSON object: truncated JSON"},
		{"{]", "f.jsonl:1: not a JSON object: invalid JSON at byte 2: invalid character ']'"},
		{"[1,2]", "f.jsonl:1: not a JSON object (got a list)"},
		{good + "\n" + good, "id \"x\" already used on line 1"},
		{strings.Replace(good, `"memplan.published/v1"`, `"v2"`, 1), "field schema"},
		{strings.Replace(good, `"micro_batch":1`, `"micro_batch":0`, 1), "field micro_batch"},
		{strings.Replace(good, `"micro_batch":1`, `"micro_batch":"one"`, 1), "field micro_batch: want a whole number, got a string"},
		{strings.Replace(good, `"seq":128`, `"seq":-5`, 1), "field seq"},
		{strings.Replace(good, `"metric":"max_memory_allocated"`, `"metric":"peak"`, 1), "field metric: unknown \"peak\""},
		{strings.Replace(good, `"outcome":"ok"`, `"outcome":"crash"`, 1), "field outcome"},
		{strings.Replace(good, `"measured":1.5`, `"measured":null`, 1), "field measured: null for an ok row"},
		{strings.Replace(good, `"measured":1.5`, `"measured":-1`, 1), "field measured: want a positive number"},
		{strings.Replace(good, `"unit":"GB"`, `"unit":"TB"`, 1), "field unit: unknown \"TB\""},
		{strings.Replace(good, `"measured":1.5`, `"measured":1e300`, 1), "is not a GPU's memory"},
		{strings.Replace(good, `"model":{"name":"llama-2-7b"}`, `"model":{}`, 1), "field model"},
		{strings.Replace(good, `"model":{"name":"llama-2-7b"}`, `"model":{"name":7}`, 1), "field model.name: want a string, got a number"},
		{strings.Replace(good, `"gpus":1`, `"gpus":0`, 1), "field gpus"},
		{strings.Replace(good, `"accum":1`, `"accum":0`, 1), "field accum"},
		{good + " {}", "more than one JSON value"},
	} {
		_, err := Read(strings.NewReader(c.in), "f.jsonl")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60q: error %v, want it to contain %q", c.in, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%.60q: error is not one line: %q", c.in, err)
		}
	}
}

// A row memplan cannot express is listed with the field that needs the
// capability, never predicted as a near neighbour.
func TestUnsupportedFieldsAreNamed(t *testing.T) {
	base := `{"schema":"memplan.published/v1","id":"x","framework":"litgpt","model":{"name":"llama-2-7b"},"gpu":"a100-40gb","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":128,"accum":1,"precision":"bf16-true","optimizer":"torch.optim.AdamW","activation_checkpointing":"none","metric":"max_memory_allocated","measured":1.5,"unit":"GB","outcome":"ok"}`
	for _, c := range []struct{ from, to, field string }{
		{`"framework":"litgpt"`, `"framework":"colossalai"`, "framework"},
		{`"precision":"bf16-true"`, `"precision":"fp8-e4m3"`, "precision"},
		{`"optimizer":"torch.optim.AdamW"`, `"optimizer":"Shampoo"`, "optimizer"},
		{`"activation_checkpointing":"none"`, `"activation_checkpointing":"unknown"`, "activation_checkpointing"},
		{`"metric":"max_memory_allocated"`, `"metric":"unknown"`, "metric"},
		{`"parallel":{"strategy":"none"}`, `"parallel":{"strategy":"pipeline"}`, "parallel"},
		{`"gpu":"a100-40gb"`, `"gpu":"b300"`, "gpu"},
		{`"model":{"name":"llama-2-7b"}`, `"model":{"name":"llama-9"}`, "model.name"},
		{`"accum":1`, `"accum":1,"quantization":"gptq"`, "quantization"},
	} {
		rows, err := Read(strings.NewReader(strings.Replace(base, c.from, c.to, 1)), "f.jsonl")
		if err != nil {
			t.Fatalf("%s: %v", c.to, err)
		}
		r := Predict(&rows[0], ".")
		found := false
		for _, l := range r.Lacks {
			found = found || l.Field == c.field
		}
		if !found || r.Predicted != 0 {
			t.Errorf("%s: lacks %v, predicted %d; want a lack naming %q and no prediction", c.to, r.Lacks, r.Predicted, c.field)
		}
	}
}

// A reserved-type or nvidia-smi row is predicted from the allocator replay,
// except for a sharded job, whose all-gather and reduce-scatter streams keep
// their own pools: that row names the missing capability on its metric.
func TestReservedRows(t *testing.T) {
	base := `{"schema":"memplan.published/v1","id":"x","framework":"torchtune","model":{"name":"llama-3.1-8b"},"gpu":"h100-sxm","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":2048,"accum":1,"precision":"dtype: bf16","optimizer":"torch.optim.AdamW (fused=True)","activation_checkpointing":"full","metric":"max_memory_reserved","measured":60,"unit":"GiB","outcome":"ok","libraries":{"torch":"2.5.1+cu124"}}`
	one := func(js string) Result {
		rows, err := Read(strings.NewReader(js), "f.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		return Predict(&rows[0], ".")
	}
	r := one(base)
	if len(r.Lacks) > 0 || r.Err != "" || r.Reserved == 0 || r.Predicted != r.Reserved || r.Outside != 0 {
		t.Fatalf("reserved row: %+v", r)
	}
	smi := one(strings.Replace(base, `"max_memory_reserved"`, `"nvidia-smi"`, 1))
	if smi.Reserved != r.Reserved || smi.Outside != 400e6 || smi.Predicted != r.Reserved+400e6 || !strings.Contains(smi.OutsideSource, "#107667") {
		t.Errorf("nvidia-smi row on a lazy-loading era: reserved %d (want %d), outside %d from %q", smi.Reserved, r.Reserved, smi.Outside, smi.OutsideSource)
	}
	ddp := one(strings.Replace(strings.Replace(base, `"max_memory_reserved"`, `"nvidia-smi"`, 1), `"gpus":1,"parallel":{"strategy":"none"}`, `"gpus":2,"parallel":{"strategy":"ddp","degree":2}`, 1))
	if ddp.Outside != 400e6+544e6 {
		t.Errorf("nvidia-smi row of a DDP job: outside %d, want the context and one communicator (944e6)", ddp.Outside)
	}
	fsdp := one(strings.Replace(base, `"gpus":1,"parallel":{"strategy":"none"}`, `"gpus":8,"parallel":{"strategy":"fsdp","degree":8}`, 1))
	if len(fsdp.Lacks) != 1 || fsdp.Lacks[0].Field != "metric" || !strings.Contains(fsdp.Lacks[0].Capability, "one stream") {
		t.Errorf("sharded reserved row: lacks %v, want the metric's missing stream pools", fsdp.Lacks)
	}
}

// A row's era decides PyTorch's defaults and the CUDA context.
func TestEra(t *testing.T) {
	for _, c := range []struct {
		libs           map[string]string
		version, notes string
		torch, cuda    [2]int
		lazy           bool
		context        units.Bytes
	}{
		{map[string]string{"torch": "2.1.0+cu121"}, "", "", [2]int{2, 1}, [2]int{12, 1}, true, 400e6},
		{map[string]string{"torch": "git 1963fc8 (2024-12-23)"}, "", "", [2]int{2, 5}, [2]int{}, true, 400e6},
		{nil, "transformers (doc runs of 2022-01)", "GPU: V100, driver 460.91.03, CUDA 11.2", [2]int{1, 10}, [2]int{11, 2}, false, 1343 << 20},
		{nil, "runs of March 2020", "CUDA 10.1", [2]int{1, 4}, [2]int{10, 1}, false, 721 << 20},
		{map[string]string{"torch": "1.13.1", "cuda": "11.6"}, "", "", [2]int{1, 13}, [2]int{11, 6}, false, 1343 << 20},
		{map[string]string{"torch": "1.8.2+cu111"}, "", "", [2]int{1, 8}, [2]int{11, 1}, false, 1343 << 20},
		{map[string]string{"torch": "1.13.1+cu117"}, "", "", [2]int{1, 13}, [2]int{11, 7}, true, 400e6},
		{nil, "version not stated", "", [2]int{}, [2]int{}, false, 0},
	} {
		r := Row{Libraries: c.libs, FrameworkVersion: c.version, Notes: c.notes}
		e := EraOf(&r)
		ctx, _, _ := contextOf(e, "v100-16gb")
		if other, _, _ := contextOf(e, "a100-40gb"); !e.LazyLoaded && e.CUDA[0] == 11 && other != 1687<<20 {
			t.Errorf("%v: eager CUDA 11 context on a GPU the table has no row for: %d, want #55277's 1687 MiB", c.libs, other)
		}
		if e.Torch != c.torch || e.CUDA != c.cuda || e.LazyLoaded != c.lazy || ctx != c.context {
			t.Errorf("%v %q %q: torch %v cuda %v lazy %v context %d; want %v %v %v %d", c.libs, c.version, c.notes, e.Torch, e.CUDA, e.LazyLoaded, ctx, c.torch, c.cuda, c.lazy, c.context)
		}
	}
}

func TestMeasuredBytesUnits(t *testing.T) {
	for _, c := range []struct {
		v    float64
		unit string
		want float64
	}{{9.69, "GB", 9.69e9}, {82.4, "GiB", 82.4 * (1 << 30)}, {14949, "MiB", 14949 * (1 << 20)}, {1024, "bytes", 1024}} {
		r := Row{Measured: &c.v, Unit: c.unit}
		if got := float64(r.MeasuredBytes()); math.Abs(got-c.want) > 1 {
			t.Errorf("%g %s = %g bytes, want %g", c.v, c.unit, got, c.want)
		}
	}
}

func FuzzRead(f *testing.F) {
	f.Add(`{"schema":"memplan.published/v1","id":"x","framework":"litgpt","model":{"name":"llama-2-7b"},"gpu":"a100-40gb","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":128,"accum":1,"precision":"bf16-true","optimizer":"torch.optim.AdamW","activation_checkpointing":"none","metric":"max_memory_allocated","measured":1.5,"unit":"GB","outcome":"ok"}`)
	f.Add("{}\n{}")
	// The release and tool mappings (gqaInSDPA, loadedPrecision).
	f.Add(`{"schema":"memplan.published/v1","id":"h","framework":"hf-trainer","framework_version":"4.57.1","libraries":{"transformers":"5.2.0","torch":"2.9.0"},"model":{"name":"gemma-2-9b"},"gpu":"h100","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":8192,"accum":1,"precision":"fp16=True","optimizer":"adamw_torch","activation_checkpointing":"none","metric":"max_memory_allocated","measured":30,"unit":"GB","outcome":"ok","notes":"flash_attention_2, no padding"}`)
	f.Add(`{"schema":"memplan.published/v1","id":"a","framework":"axolotl","libraries":{},"model":{"name":"llama-3-8b"},"gpu":"h100","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":512,"accum":1,"precision":"bf16: true","optimizer":"adamw_bnb_8bit","activation_checkpointing":"full","quantization":"bnb.nf4","peft":{"method":"lora","r":8,"alpha":16,"dropout":0.05,"targets":["q_proj"]},"metric":"max_memory_allocated","measured":30,"unit":"GB","outcome":"ok","notes":"sdp_attention: true"}`)
	f.Fuzz(func(t *testing.T, s string) {
		rows, err := Read(strings.NewReader(s), "f")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		for i := range rows {
			// Mapping never panics, whatever the row says (planning is
			// left out: fuzzed sizes can be any positive int).
			rows[i].Job(".")
		}
	})
}

func TestTypeErrorsSpeakJSON(t *testing.T) {
	_, err := Read(strings.NewReader(`{"schema":"memplan.published/v1","id":"x","accum":"four"}`), "f")
	if err == nil || !strings.Contains(err.Error(), "f:1: field accum: want a whole number, got a string") {
		t.Errorf("error %v", err)
	}
}

// Framework terms map to memplan's rows the way the frameworks mean them.
func TestFrameworkTerms(t *testing.T) {
	for in, want := range map[string]string{
		"bf16-true":                             "pure-bf16",
		"dtype: bf16":                           "pure-bf16",
		"dtype: fp32":                           "fp32",
		"bf16=True (autocast)":                  "amp-bf16",
		"--bf16 true":                           "amp-bf16",
		"bf16: true":                            "amp-bf16",
		"fp16=True (GradScaler)":                "amp-fp16",
		"16-mixed":                              "amp-fp16",
		"fp32 (Trainer default)":                "fp32",
		"torch.autocast(dtype=torch.bfloat16)":  "amp-bf16",
		"bf16=True, torch_dtype=torch.bfloat16": "pure-bf16",
		"bf16=True, dtype=torch.bfloat16":       "pure-bf16",
		"fp16=True, dtype=float16":              "pure-fp16",
	} {
		p, ok := precisionOf(in)
		if !ok || p.String() != want {
			t.Errorf("precision %q: %v %v, want %s", in, p, ok, want)
		}
	}
	if _, ok := precisionOf("FSDP2 MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)"); ok {
		t.Error("FSDP2's mixed precision over float32 shards is no precision row yet")
	}
	for in, want := range map[string]string{"none": "none", "False": "none", "full": "full", "True": "full", "gradient_checkpointing=True": "full", "unknown": "unknown", "selective op (torchtitan selective_ac_option='op')": "selective-op", "every 2nd block": "every 2nd block"} {
		if got := checkpointingOf(in); got != want {
			t.Errorf("checkpointing %q: %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string][2]bool{"bnb.nf4": {false, true}, "bnb.nf4-dq": {true, true}, "bitsandbytes nf4, double quant": {true, true}, "torchao NF4": {true, true}, "int8": {false, false}, "gptq": {false, false}} {
		dq, ok := nf4Of(in)
		if [2]bool{dq, ok} != want {
			t.Errorf("quantization %q: dq %v ok %v, want %v", in, dq, ok, want)
		}
	}
	for in, want := range map[string]string{"ZeRO stage 2, overlap_comm": "2", "zero-3 with offload_param": "3", "stage: 1": "1"} {
		if m := zeroStageRE.FindStringSubmatch(strings.ToLower(in)); m == nil || m[1] != want {
			t.Errorf("zero details %q: %v, want stage %s", in, m, want)
		}
	}
	if got := strings.Join(hfTargets([]string{"q_proj", "output_proj", "w1", "w2", "w3", "all"}), ","); got != "q_proj,o_proj,gate_proj,down_proj,up_proj,all-linear" {
		t.Errorf("torchtune targets: %s", got)
	}
	var lacks []Lack
	for in, want := range map[string]string{
		"torch.optim.AdamW (fused=True)":           "optimizer=adamw,optimizer.impl=fused",
		"bitsandbytes.optim.PagedAdamW8bit":        "optimizer=adamw8bit,optimizer.paged=true",
		"adamw_hf":                                 "optimizer=adamw,optimizer.impl=single",
		"torch.optim.AdamW, optimizer_in_bwd=True": "optimizer=adamw,optimizer.in-backward=true",
		"torch.optim.SGD(momentum=0.9)":            "optimizer=sgd-momentum",
		"adafactor (Trainer optim='adafactor')":    "optimizer=adafactor",
	} {
		if got := strings.Join(optimizerOf(in, &lacks), ","); got != want {
			t.Errorf("optimizer %q: %s, want %s", in, got, want)
		}
	}
	if len(lacks) > 0 {
		t.Errorf("lacks %v", lacks)
	}
}

// What a row's era decides in the job: PyTorch < 2.0 keeps gradients
// allocated between steps in the loops that call zero_grad() with the
// default (the Trainer, plain loops), moves the cuBLAS workspace out of the
// allocated peak and into the memory outside the allocator; notes naming
// set_to_none decide over the era; notes naming eager attention set it.
func TestEraInTheJob(t *testing.T) {
	base := `{"schema":"memplan.published/v1","id":"x","framework":"hf-trainer","framework_version":"transformers (runs of 2022-01)","model":{"name":"bert-base"},"gpu":"v100-16gb","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":128,"accum":1,"precision":"fp32","optimizer":"adamw_hf","activation_checkpointing":"none","metric":"nvidia-smi","measured":3000,"unit":"MiB","outcome":"ok","notes":"CUDA 11.2"}`
	job := func(fromTo ...string) *engine.Spec {
		js := base
		for i := 0; i+1 < len(fromTo); i += 2 {
			js = strings.Replace(js, fromTo[i], fromTo[i+1], 1)
		}
		rows, err := Read(strings.NewReader(js), "f.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		s, _, lacks := rows[0].Job(".")
		if len(lacks) > 0 {
			t.Fatalf("%v: %v", fromTo, lacks)
		}
		return s
	}
	old := job()
	if old.Sem.ZeroGrad != lower.ZeroInPlace || old.Sem.Workspace != 0 || old.Sem.Overhead != 1343<<20+2*8519680 || old.Attention != build.SDPA {
		t.Errorf("hf 2022-01: zero-grad %v, workspace %d, outside %d, attention %v; want in-place, 0, 1343 MiB + 2 workspaces, sdpa", old.Sem.ZeroGrad, old.Sem.Workspace, old.Sem.Overhead, old.Attention)
	}
	if s := job(`"framework":"hf-trainer"`, `"framework":"deepspeed"`); s.Sem.ZeroGrad == lower.ZeroInPlace {
		t.Error("deepspeed 2022-01: its engine's zero_grad is not PyTorch's default; the era should not set in-place")
	}
	if s := job(`"notes":"CUDA 11.2"`, `"notes":"CUDA 11.2; model.zero_grad(set_to_none=True); eager attention"`); s.Sem.ZeroGrad != lower.ZeroToNone || s.Attention != build.Eager {
		t.Errorf("notes naming set_to_none=True and eager attention: %v %v", s.Sem.ZeroGrad, s.Attention)
	}
	now := job(`(runs of 2022-01)`, `(runs of 2024-06)`, `"notes":"CUDA 11.2"`, `"notes":""`)
	if now.Sem.ZeroGrad != lower.ZeroToNone || now.Sem.Workspace != 8519680 || now.Sem.Overhead != 400e6 {
		t.Errorf("hf 2024-06: zero-grad %v, workspace %d, outside %d; want set-to-none, 8519680, 400 MB", now.Sem.ZeroGrad, now.Sem.Workspace, now.Sem.Overhead)
	}
	// transformers 5.x runs a mixture's experts as grouped matmuls; 4.x,
	// an unknown version, and recipes outside its modeling code keep the loop.
	for libs, want := range map[string]bool{
		`{"transformers":"5.24.0"}`: true, `{"Transformers":"v5.0.0 (pinned)"}`: true, `{"transformers":"4.57.1"}`: false,
		`{"transformers":">=5.0"}`: false, `{}`: false,
	} {
		if s := job(`"model":`, `"libraries":`+libs+`,"model":`); s.Sem.GroupedExperts != want {
			t.Errorf("hf with libraries %s: grouped experts %v, want %v", libs, s.Sem.GroupedExperts, want)
		}
	}
	if s := job(`"framework":"hf-trainer"`, `"framework":"litgpt"`, `"model":`, `"libraries":{"transformers":"5.24.0"},"model":`); s.Sem.GroupedExperts {
		t.Error("litgpt with transformers 5.x installed runs its own model code: the experts' loop")
	}
}

// TestGQAInSDPAByEra: transformers 4.54+ on PyTorch 2.5+ hands grouped k and v
// to SDPA (enable_gqa) when the mask is None — no padding, no window the
// sequence reaches (use_gqa_in_sdpa, _ignore_causal_mask_sdpa @v4.54.0);
// before, or with either missing, repeat_kv copies them (the hf recipe's
// attention.repeat-kv=true).
func TestGQAInSDPAByEra(t *testing.T) {
	base := `{"schema":"memplan.published/v1","id":"x","framework":"hf-trainer","framework_version":"FV","libraries":LIBS,"model":{"name":"MODEL"},"gpu":"h100","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":SEQ,"accum":1,"precision":"bf16=True","optimizer":"adamw_torch","activation_checkpointing":"none","metric":"max_memory_allocated","measured":30,"unit":"GB","outcome":"ok","notes":"NOTES"}`
	type row struct {
		framework, fv, libs, model, seq, notes string
	}
	mk := func(r row) string {
		if r.framework == "" {
			r.framework = "hf-trainer"
		}
		if r.model == "" {
			r.model = "llama-3-8b"
		}
		if r.seq == "" {
			r.seq = "2048"
		}
		js := strings.NewReplacer("FV", r.fv, "LIBS", r.libs, "MODEL", r.model, "SEQ", r.seq, "NOTES", r.notes).Replace(base)
		return strings.Replace(js, `"framework":"hf-trainer"`, `"framework":"`+r.framework+`"`, 1)
	}
	for _, c := range []struct {
		name       string
		r          row
		repeat     bool
		lackPrefix string
	}{
		{"4.56 on torch 2.6", row{libs: `{"transformers":"4.56.2","torch":"2.6.0+cu124"}`}, false, ""},
		{"5.0 on torch 2.8", row{libs: `{"transformers":"5.0.0","torch":"2.8.0"}`}, false, ""},
		{"4.53 copies always", row{libs: `{"transformers":"4.53.3","torch":"2.6.0"}`}, true, ""},
		{"4.48 copies always", row{libs: `{"transformers":"4.48.0","torch":"2.5.1"}`}, true, ""},
		{"torch 2.4 has no enable_gqa", row{libs: `{"transformers":"4.56.0","torch":"2.4.1"}`}, true, ""},
		{"torch unknown", row{libs: `{"transformers":"4.56.0"}`}, true, ""},
		{"torch from the run's date", row{fv: "runs of 2025-09", libs: `{"transformers":"4.56.0"}`}, false, ""},
		{"the trainer's own version", row{fv: "4.57.1", libs: `{"torch":"2.7.0"}`}, false, ""},
		{"peft's version is not transformers'", row{framework: "peft", fv: "0.17.0", libs: `{"torch":"2.7.0"}`}, true, ""},
		{"a bound is not a version", row{libs: `{"transformers":">=4.56","torch":"2.7.0"}`}, true, ""},
		{"padded batches keep a mask", row{libs: `{"transformers":"4.56.0","torch":"2.7.0"}`, notes: "alpaca, padded to the longest sample in the batch"}, true, ""},
		{"no padding", row{libs: `{"transformers":"4.56.0","torch":"2.7.0"}`, notes: "fixed-length random tokens, no padding"}, false, ""},
		{"deepspeed runs the same modeling code", row{framework: "deepspeed", libs: `{"transformers":"4.56.0","torch":"2.7.0"}`}, false, ""},
		{"torchtune runs its own", row{framework: "torchtune", libs: `{"transformers":"4.56.0","torch":"2.7.0"}`}, true, ""},
		{"flash-attention 2 never copies", row{libs: `{"transformers":"4.46.0","torch":"2.4.0"}`, notes: "attn_implementation='flash_attention_2', padded batches"}, false, ""},
		{"torchtune has no flash-attention path", row{framework: "torchtune", libs: `{"torch":"2.4.0"}`, notes: "flash_attention_2"}, true, ""},
		{"mistral under its window", row{model: "mistral-7b", seq: "4095", libs: `{"transformers":"4.56.0","torch":"2.7.0"}`}, false, ""},
		{"mistral at its window is masked", row{model: "mistral-7b", seq: "4096", libs: `{"transformers":"4.56.0","torch":"2.7.0"}`}, true, ""},
		{"gemma-2 windows every other layer", row{model: "gemma-2-9b", seq: "8192", libs: `{"transformers":"4.56.0","torch":"2.7.0"}`}, true, "model: transformers 4.56 hands grouped heads to SDPA on the full-attention layers and copies them on the sliding-window ones"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := jobOf(t, mk(c.r), ".", c.lackPrefix)
			if s != nil && s.Sem.RepeatKV != c.repeat {
				t.Errorf("attention.repeat-kv %v, want %v", s.Sem.RepeatKV, c.repeat)
			}
		})
	}
	// Heads wider than flash's 256 keep the copies (5.24's use_gqa_in_sdpa).
	dir := t.TempDir()
	cfg, err := os.ReadFile("../models/catalog/llama-3.2-1b.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, hd := range []string{"256", "288"} {
		wide := strings.Replace(string(cfg), `"head_dim": 64`, `"head_dim": `+hd, 1)
		if err := os.WriteFile(filepath.Join(dir, "wide.json"), []byte(wide), 0o644); err != nil {
			t.Fatal(err)
		}
		js := strings.Replace(mk(row{libs: `{"transformers":"5.24.0","torch":"2.9.0"}`}), `{"name":"llama-3-8b"}`, `{"name":null,"hf_id":"x/wide","config":"wide.json"}`, 1)
		s := jobOf(t, js, dir, "")
		if want := hd != "256"; s.Sem.RepeatKV != want {
			t.Errorf("head_dim %s: attention.repeat-kv %v, want %v", hd, s.Sem.RepeatKV, want)
		}
	}
}

// TestLoadDTypeByEra: transformers 5.x loads a checkpoint in its own dtype
// (from_pretrained's dtype "auto"), 4.x in float32, so a Trainer row with
// bf16=True trains bfloat16 parameters under 5.x when the checkpoint is
// bfloat16 (llama-3-8b), and keeps autocast over float32 otherwise.
func TestLoadDTypeByEra(t *testing.T) {
	base := `{"schema":"memplan.published/v1","id":"x","framework":"FW","libraries":LIBS,"model":{"name":"MODEL"},"gpu":"h100","gpus":GPUS,"parallel":PAR,"micro_batch":1,"seq":512,"accum":1,"precision":"PREC","optimizer":"adamw_torch","activation_checkpointing":"none","quantization":QUANT,"peft":PEFT,"metric":"max_memory_allocated","measured":30,"unit":"GB","outcome":"ok","notes":"NOTES"}`
	type row struct{ fw, libs, model, prec, par, quant, peft, notes string }
	mk := func(r row) string {
		def := func(v *string, d string) {
			if *v == "" {
				*v = d
			}
		}
		def(&r.fw, "hf-trainer")
		def(&r.libs, `{"transformers":"5.2.0","torch":"2.9.0"}`)
		def(&r.model, "llama-3-8b")
		def(&r.prec, "bf16=True")
		def(&r.par, `{"strategy":"none"}`)
		def(&r.quant, "null")
		def(&r.peft, "null")
		gpus := "1"
		if strings.Contains(r.par, "fsdp") || strings.Contains(r.par, "ddp") {
			gpus = "2"
		}
		return strings.NewReplacer("FW", r.fw, "LIBS", r.libs, "MODEL", r.model, "PREC", r.prec, "PAR", r.par, "QUANT", r.quant, "NOTES", r.notes, "GPUS", gpus, "PEFT", r.peft).Replace(base)
	}
	lora := `{"method":"lora","r":8,"alpha":16,"dropout":0.05,"targets":["q_proj","v_proj"]}`
	for _, c := range []struct {
		name string
		r    row
		want ops.Precision
		lack string
	}{
		{"5.x loads bfloat16", row{}, ops.AutocastBF16, ""},
		{"4.x loads float32", row{libs: `{"transformers":"4.57.1","torch":"2.9.0"}`}, ops.AMPBF16, ""},
		{"version unknown", row{libs: `{}`}, ops.AMPBF16, ""},
		{"a float32 checkpoint", row{model: "bert-large"}, ops.AMPBF16, ""},
		{"a stated dtype", row{notes: "from_pretrained(torch_dtype=torch.float32)"}, ops.AMPBF16, ""},
		{"ddp", row{par: `{"strategy":"ddp","degree":2}`}, ops.AutocastBF16, ""},
		{"fsdp upcasts", row{par: `{"strategy":"fsdp","degree":2}`}, ops.AMPBF16, ""},
		{"quantized base", row{quant: `"bnb.nf4"`, peft: `{"method":"lora","r":8,"alpha":16,"dropout":0.05,"targets":["q_proj","v_proj"]}`}, ops.AMPBF16, ""},
		{"pure precision stays", row{prec: "torch_dtype=bfloat16, bf16=True"}, ops.PureBF16, ""},
		{"torchtune is not transformers", row{fw: "torchtune", prec: "dtype: bf16"}, ops.PureBF16, ""},
		{"5.x LoRA with fp16=True over float16 trains float32 adapters", row{model: "llama-2-7b", prec: "fp16=True", peft: lora}, ops.PureFP16, ""},
		{"LLaMA-Factory LoRA: 16-bit base", row{fw: "llama-factory", libs: "{}", peft: lora}, ops.AutocastBF16, ""},
		{"LLaMA-Factory full: float32 trainable", row{fw: "llama-factory", libs: "{}"}, ops.AMPBF16, ""},
		{"LLaMA-Factory pure_bf16", row{fw: "llamafactory", libs: "{}", notes: "pure_bf16: true"}, ops.PureBF16, ""},
		{"LLaMA-Factory under ZeRO-3 loads float32", row{fw: "llama-factory", libs: "{}", peft: lora, par: `{"strategy":"zero","degree":2,"details":"stage 3"}`}, ops.AMPBF16, ""},
		{"axolotl LoRA: 16-bit base", row{fw: "axolotl", libs: "{}", prec: "bf16: true", peft: lora}, ops.AutocastBF16, ""},
		{"axolotl full with flash attention", row{fw: "axolotl", libs: "{}", prec: "bf16: true", notes: "flash_attention: true"}, ops.AutocastBF16, ""},
		{"axolotl full with sdpa", row{fw: "axolotl", libs: "{}", prec: "bf16: true", notes: "sdp_attention: true"}, 0, "precision: axolotl keeps embed_tokens, lm_head and every norm in float32 and the rest in the bfloat16 it loads"},
		{"LLaMA-Factory QLoRA: the rest in the compute dtype", row{fw: "llama-factory", libs: "{}", quant: `"bnb.nf4"`, peft: lora}, ops.AutocastBF16, ""},
		{"axolotl QLoRA: norms and embeddings cast back", row{fw: "axolotl", libs: "{}", prec: "bf16: true", quant: `"bnb.nf4"`, peft: lora}, ops.AutocastBF16, ""},
		{"fp16=True over bfloat16", row{prec: "fp16=True"}, 0, "precision: transformers 5.2 loads the checkpoint's bfloat16 (from_pretrained's dtype \"auto\"), and fp16=True over bfloat16 parameters is autocast to the other 16-bit dtype"},
		{"fp16=True over float16", row{model: "llama-2-7b", prec: "fp16=True"}, 0, "precision: transformers 5.2 loads the checkpoint's float16 (from_pretrained's dtype \"auto\"), and fp16=True over float16 parameters stops at the first step"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := jobOf(t, mk(c.r), ".", c.lack)
			if s == nil {
				return
			}
			if s.Precision != c.want {
				t.Errorf("precision %v, want %v", s.Precision, c.want)
			}
			// peft's float32 cast of the unquantized rest stays for the
			// Trainer's own QLoRA, not for the tools'.
			if wantRest := c.r.quant != "" && c.r.fw == ""; s.QLoRA && s.Sem.Quant.FP32Rest != wantRest {
				t.Errorf("qlora.prepare-kbit %v, want %v", s.Sem.Quant.FP32Rest, wantRest)
			}
		})
	}
}

// TestTrainerDefaultOptimByEra: the Trainer's default optim is adamw_torch_fused from transformers 4.54 on
// PyTorch 2.8+ (training_args.py default_optim), adamw_torch (foreach) before; a row naming its optim keeps it.
func TestTrainerDefaultOptimByEra(t *testing.T) {
	base := `{"schema":"memplan.published/v1","id":"x","framework":"FW","libraries":LIBS,"model":{"name":"llama-3.2-1b"},"gpu":"h100","gpus":1,"parallel":{"strategy":"none"},"micro_batch":1,"seq":512,"accum":1,"precision":"bf16=True","optimizer":"OPT","activation_checkpointing":"none","metric":"max_memory_allocated","measured":10,"unit":"GB","outcome":"ok"}`
	for _, c := range []struct {
		fw, libs, opt string
		want          lower.Impl
	}{
		{"hf-trainer", `{"transformers":"4.56.0","torch":"2.8.0"}`, "AdamW (Trainer default)", lower.Fused},
		{"trl", `{"transformers":"5.2.0","torch":"2.9.1"}`, "torch.optim.AdamW, the Trainer's default optim", lower.Fused},
		{"hf-trainer", `{"transformers":"4.56.0","torch":"2.7.1"}`, "AdamW (Trainer default)", lower.Foreach},
		{"hf-trainer", `{"transformers":"4.53.2","torch":"2.8.0"}`, "AdamW (Trainer default)", lower.Foreach},
		{"hf-trainer", `{"transformers":"4.56.0","torch":"2.8.0"}`, "adamw_torch (not the default)", lower.Foreach},
		{"hf-trainer", `{"transformers":"4.56.0","torch":"2.8.0"}`, "AdamW", lower.Foreach},
		{"axolotl", `{"transformers":"4.56.0","torch":"2.8.0"}`, "AdamW (axolotl default)", lower.Foreach},
	} {
		js := strings.NewReplacer("FW", c.fw, "LIBS", c.libs, "OPT", c.opt).Replace(base)
		if c.fw == "axolotl" { // full fine-tuning under its bf16 flag is a lack (TestLoadDTypeByEra)
			js = strings.Replace(js, `"bf16=True"`, `"fp32"`, 1)
		}
		if s := jobOf(t, js, ".", ""); s.Impl != c.want {
			t.Errorf("%s %s %q: optimizer implementation %v, want %v", c.fw, c.libs, c.opt, s.Impl, c.want)
		}
	}
}

// jobOf maps the one row of js (configs relative to dir) and returns its
// spec. With lackPrefix set the row must lack exactly one capability, its
// line starting so, and the spec is nil; without, any lack fails the test.
func jobOf(t *testing.T, js, dir, lackPrefix string) *engine.Spec {
	t.Helper()
	rows, err := Read(strings.NewReader(js), "f.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	s, _, lacks := rows[0].Job(dir)
	switch {
	case lackPrefix != "":
		if len(lacks) != 1 || !strings.HasPrefix(lacks[0].String(), lackPrefix) {
			t.Fatalf("lacks %v, want one starting %q", lacks, lackPrefix)
		}
		return nil
	case len(lacks) > 0:
		t.Fatal(lacks)
	}
	return s
}
