package build

import (
	"math"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
)

func lookup(t testing.TB, name string) *models.Arch {
	t.Helper()
	a, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// gpt2Style is a GPT-2 configuration with the given size and dropout on, as
// Korthikanti et al. assume (the same as engine's test helper).
func gpt2Style(t testing.TB, s, h, a int) *models.Arch {
	arch := lookup(t, "gpt2").Clone()
	arch.Hidden, arch.Heads, arch.KVHeads, arch.HeadDim, arch.Intermediate = h, a, a, h/a, 4*h
	arch.MaxPositions = s
	arch.Layers = 3
	arch.AttnDropout, arch.HiddenDropout, arch.EmbdDropout = 0.1, 0.1, 0.1
	return arch
}

// simulate builds, lowers (one AdamW step) and simulates a training graph.
func simulate(t testing.TB, a *models.Arch, o Options) (*ir.Program, *sim.Result) {
	t.Helper()
	o.Training = true
	g, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	p, err := lower.Train(g, lower.TrainConfig{Optimizer: lower.AdamW, Precision: o.Precision, WeightDecay: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Verify(); err != nil {
		t.Fatal(err)
	}
	r, err := sim.Run(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, r
}

// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", MLSys 2023, Table 2: with tensor parallel degree t a transformer
// layer saves sbh(10 + 24/t + 5as/(ht)) bytes; with tensor + sequence
// parallel sbh/t·(34 + 5as/h) (16-bit activations, 1-byte dropout masks).
// Measured here on the simulated per-GPU program of a GPT-2-style model,
// middle block.
func TestKorthikantiTable2TensorParallel(t *testing.T) {
	points := []struct{ s, h, a, b int }{
		{512, 768, 16, 2},
		{1024, 1024, 16, 1},
		{2048, 2048, 32, 1},
	}
	for _, tp := range []int{2, 4, 8} {
		for _, pt := range points {
			for _, sp := range []bool{false, true} {
				arch := gpt2Style(t, pt.s, pt.h, pt.a)
				_, r := simulate(t, arch, Options{MicroBatch: pt.b, Seq: pt.s, Precision: ops.FP16, Attention: Eager, TP: tp, SP: sp})
				s, b, h, a, tt := float64(pt.s), float64(pt.b), float64(pt.h), float64(pt.a), float64(tp)
				want := s * b * h * (10 + 24/tt + 5*a*s/(h*tt))
				row := "tensor parallel"
				if sp {
					want = s * b * h / tt * (34 + 5*a*s/h)
					row = "tensor + sequence parallel"
				}
				got := float64(r.SavedByModule["transformer.h.1"])
				rel := math.Abs(got-want) / want
				t.Logf("%s t=%d s=%d h=%d a=%d b=%d: saved %.0f, Table 2 %.0f (%+.3f%%)", row, tp, pt.s, pt.h, pt.a, pt.b, got, want, 100*(got-want)/want)
				if rel > 0.02 {
					t.Errorf("%s t=%d s=%d h=%d a=%d: saved %.0f bytes per layer, Table 2 gives %.0f (%.2f%% off)", row, tp, pt.s, pt.h, pt.a, got, want, 100*rel)
				}
			}
		}
	}
}

// paramNumel maps parameter names to element counts.
func paramNumel(g *ir.Graph) map[string]int64 {
	out := map[string]int64{}
	for _, id := range g.Params {
		out[g.Tensors[id].Name] = g.Tensors[id].Numel()
	}
	return out
}

var (
	colLinears = map[string]bool{"q_proj": true, "k_proj": true, "v_proj": true, "c_attn": true, "query_key_value": true, "qkv_proj": true,
		"gate_proj": true, "up_proj": true, "gate_up_proj": true, "c_fc": true, "dense_h_to_4h": true, "fc1": true}
	rowLinears = map[string]bool{"o_proj": true, "down_proj": true, "c_proj": true, "dense": true, "dense_4h_to_h": true, "fc2": true}
	vocabMats  = map[string]bool{"embed_tokens": true, "wte": true, "lm_head": true, "embed_out": true, "embed_in": true}
)

// Megatron tensor parallel on one rank: column-parallel weights and biases
// and row-parallel weights hold 1/t of the parameters, the vocabulary
// matrices (V_padded/t)·h, and norms, position tables and row-parallel
// biases stay whole.
func TestTensorParallelParams(t *testing.T) {
	for _, tc := range []struct {
		model string
		tps   []int
	}{
		{"llama-2-7b", []int{2, 4, 8}},
		{"llama-3-8b", []int{2, 4, 8}}, // 8 KV heads
		{"gpt2", []int{2, 4}},          // biases, Conv1D, padded vocabulary
		{"pythia-160m", []int{2, 4}},
		{"phi-3-mini", []int{2, 4}}, // fused qkv and gate_up
		{"qwen3-8b", []int{2, 4, 8}},
	} {
		a := lookup(t, tc.model)
		o := Options{MicroBatch: 1, Seq: 32, Precision: ops.BF16, Training: true}
		g1, err := Graph(a, o)
		if err != nil {
			t.Fatal(err)
		}
		full := paramNumel(g1)
		for _, tp := range tc.tps {
			o.TP = tp
			g, err := Graph(a, o)
			if err != nil {
				t.Fatalf("%s TP=%d: %v", tc.model, tp, err)
			}
			got := paramNumel(g)
			if len(got) != len(full) {
				t.Errorf("%s TP=%d: %d parameters, unsharded %d", tc.model, tp, len(got), len(full))
			}
			vp := int64(paddedVocab(a.Vocab, tp, 0))
			for name, n := range full {
				parts := strings.Split(name, ".")
				leaf, kind := parts[len(parts)-2], parts[len(parts)-1]
				want := n
				switch {
				case colLinears[leaf]:
					want = n / int64(tp)
				case rowLinears[leaf] && kind == "weight":
					want = n / int64(tp)
				case vocabMats[leaf]:
					want = vp / int64(tp) * int64(a.Hidden)
				}
				if got[name] != want {
					t.Errorf("%s TP=%d: %s has %d elements, want %d (unsharded %d)", tc.model, tp, name, got[name], want, n)
				}
			}
		}
	}
}

// Megatron's _vocab_size_with_padding: GPT-2's 50257 tokens become 50304 at
// t=1 with --make-vocab-size-divisible-by 128, 50432 at t=2, 51200 at t=8.
func TestPaddedVocab(t *testing.T) {
	for _, tc := range []struct{ v, t, by, want int }{
		{50257, 1, 128, 50304}, {50257, 2, 128, 50432}, {50257, 8, 128, 51200},
		{50257, 4, 0, 50260}, {32000, 8, 0, 32000}, {32000, 8, 128, 32768},
	} {
		if got := paddedVocab(tc.v, tc.t, tc.by); got != tc.want {
			t.Errorf("paddedVocab(%d, %d, %d) = %d, want %d", tc.v, tc.t, tc.by, got, tc.want)
		}
	}
	a := lookup(t, "gpt2")
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Training: true, TP: 2, MakeVocabDivisibleBy: 128})
	if err != nil {
		t.Fatal(err)
	}
	if n := paramNumel(g)["transformer.wte.weight"]; n != 50432/2*768 {
		t.Errorf("wte on one of 2 ranks has %d elements, want %d", n, 50432/2*768)
	}
}

type commCount struct {
	kind, comm string
	bwd        bool
}

func layerComms(g *ir.Graph, prefix string) map[commCount]int {
	out := map[commCount]int{}
	for _, n := range g.Nodes {
		if !strings.HasPrefix(n.Module, prefix) {
			continue
		}
		if n.Comm != nil {
			out[commCount{n.Kind, n.Comm.Kind.String(), false}]++
		}
		if n.BwdComm != nil {
			out[commCount{n.Kind, n.BwdComm.Kind.String(), true}]++
		}
	}
	return out
}

// One decoder layer under TP has Megatron's two f and two g operators;
// under SP two all-gathers and two reduce-scatters, and each trainable
// column-parallel linear gathers its saved shard again in backward.
func TestTensorParallelCollectives(t *testing.T) {
	a := lookup(t, "llama-3.2-1b")
	B, S, t2 := int64(2), int64(64), 2
	full := int64(2) * B * S * int64(a.Hidden) // bf16 [B, S, H]
	g, err := Graph(a, Options{MicroBatch: int(B), Seq: int(S), Precision: ops.BF16, Training: true, TP: t2})
	if err != nil {
		t.Fatal(err)
	}
	got := layerComms(g, "model.layers.1.")
	want := map[commCount]int{{"tp_copy", "all_reduce", true}: 2, {"tp_all_reduce", "all_reduce", false}: 2}
	if !mapsEqual(got, want) {
		t.Errorf("TP layer collectives %v, want %v", got, want)
	}
	for _, n := range g.Nodes {
		for _, c := range []*ir.Comm{n.Comm, n.BwdComm} {
			if c != nil && strings.HasPrefix(n.Module, "model.layers.") && (int64(c.Bytes) != full || c.Group != "tp" || c.Ranks != t2) {
				t.Errorf("%s %s: comm %+v, want %d bytes over tp/%d", n.Module, n.Kind, c, full, t2)
			}
		}
	}
	g, err = Graph(a, Options{MicroBatch: int(B), Seq: int(S), Precision: ops.BF16, Training: true, TP: t2, SP: true})
	if err != nil {
		t.Fatal(err)
	}
	got = layerComms(g, "model.layers.1.")
	want = map[commCount]int{
		{"sp_all_gather", "all_gather", false}: 2, {"sp_all_gather", "reduce_scatter", true}: 2,
		{"sp_reduce_scatter", "reduce_scatter", false}: 2, {"sp_reduce_scatter", "all_gather", true}: 2,
		{"linear", "all_gather", true}: 5, // q, k, v, gate, up
	}
	if !mapsEqual(got, want) {
		t.Errorf("SP layer collectives %v, want %v", got, want)
	}
	// The column-parallel linear saves the shard and holds the gathered
	// input as a backward workspace.
	for _, n := range g.Nodes {
		if n.Kind != "linear" || n.Module != "model.layers.1.mlp.gate_proj" {
			continue
		}
		in := g.Tensors[n.In[0]]
		sv := g.Tensors[n.Saved[0]]
		if sv.Numel()*int64(t2) != in.Numel() || sv.Shape[1] != S/int64(t2) {
			t.Errorf("gate_proj saves %v, want the s/t shard of its input %v", sv.Shape, in.Shape)
		}
		if int64(n.BwdWorkspace) != full {
			t.Errorf("gate_proj backward workspace %d, want the gathered input's %d", n.BwdWorkspace, full)
		}
	}
}

func mapsEqual(a, b map[commCount]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// The loss under TP is Megatron's vocab-parallel cross-entropy over logits
// that stay sharded [b, s, V/t]; inference gathers the last token's logits.
func TestVocabParallelLoss(t *testing.T) {
	a := lookup(t, "llama-2-7b")
	g, err := Graph(a, Options{MicroBatch: 2, Seq: 32, Precision: ops.BF16, Training: true, TP: 4})
	if err != nil {
		t.Fatal(err)
	}
	n := g.Nodes[len(g.Nodes)-1]
	if n.Kind != "vocab_parallel_cross_entropy" || n.Comm == nil || n.Comm.Group != "tp" {
		t.Fatalf("last node %s (comm %v), want vocab_parallel_cross_entropy over tp", n.Kind, n.Comm)
	}
	sm := g.Tensors[n.Out[1]]
	if want := []int64{2, 32, int64(a.Vocab / 4)}; !equalShape(sm.Shape, want) || sm.DType.String() != "float32" {
		t.Errorf("saved softmax %v %s, want %v float32", sm.Shape, sm.DType, want)
	}
	g, err = Graph(a, Options{MicroBatch: 2, Seq: 32, Precision: ops.BF16, TP: 4, KVContext: 64})
	if err != nil {
		t.Fatal(err)
	}
	last := g.Nodes[len(g.Nodes)-1]
	if last.Kind != "tp_all_gather" || g.Tensors[last.Out[0]].Shape[2] != int64(a.Vocab) {
		t.Errorf("inference ends with %s %v, want the logits gathered to the full vocabulary", last.Kind, g.Tensors[last.Out[0]].Shape)
	}
	for _, id := range g.Buffers {
		if tt := g.Tensors[id]; tt.Cat == ir.KVCache && tt.Shape[1] != int64(a.KVHeads/4) {
			t.Errorf("%s holds %d KV heads, want %d", tt.Name, tt.Shape[1], a.KVHeads/4)
		}
	}
}

func equalShape(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Expert parallel: each of EP ranks holds experts/EP experts and, with data
// parallel = EP, each local expert gets T·top_k·EP/experts rows.
func TestExpertParallel(t *testing.T) {
	a := lookup(t, "mixtral-8x7b")
	B, S := 2, 64
	T, K, E := int64(B*S), int64(a.ExpertsPerToken), int64(a.NumExperts)
	for _, ep := range []int{2, 4, 8} {
		g, err := Graph(a, Options{MicroBatch: B, Seq: S, Precision: ops.BF16, Training: true, EP: ep})
		if err != nil {
			t.Fatal(err)
		}
		experts := map[string]bool{}
		var expertParams int64
		for _, id := range g.Params {
			name := g.Tensors[id].Name
			if i := strings.Index(name, ".experts."); i >= 0 {
				experts[name[:i+len(".experts.")+1]] = true
				expertParams += g.Tensors[id].Numel()
			}
		}
		if want := a.Layers * a.NumExperts / ep; len(experts) != want {
			t.Errorf("EP=%d: %d experts on a rank, want %d", ep, len(experts), want)
		}
		if want := int64(a.Layers) * E / int64(ep) * 3 * int64(a.Hidden) * int64(a.Intermediate); expertParams != want {
			t.Errorf("EP=%d: %d expert parameters, want %d", ep, expertParams, want)
		}
		var a2a int
		for _, n := range g.Nodes {
			if n.Kind == "linear" && strings.HasSuffix(n.Module, "model.layers.0.block_sparse_moe.experts.0.w1") {
				if rows, want := g.Tensors[n.In[0]].Shape[0], T*K*int64(ep)/E; rows != want {
					t.Errorf("EP=%d: local expert gets %d rows, want T·k·ep/E = %d", ep, rows, want)
				}
			}
			if n.Kind == "all_to_all" && strings.HasPrefix(n.Module, "model.layers.0.") {
				a2a++
				if n.Comm.Group != "ep" || n.Comm.Ranks != ep || n.BwdComm == nil {
					t.Errorf("EP=%d: all-to-all %+v, want the ep group both ways", ep, n.Comm)
				}
			}
		}
		if a2a != 2 {
			t.Errorf("EP=%d: %d all-to-alls in a layer, want dispatch and combine", ep, a2a)
		}
		if _, r := simulate(t, a.Clone(), Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, EP: ep}); r.Params == 0 {
			t.Error("no parameters")
		}
	}
}

// Megatron's CoreAttention, from the q/k copies through the context matmul,
// is one module scope (the lead's selective recompute matches
// "*.core_attention"); the projections and head merge stay outside.
func TestCoreAttentionScope(t *testing.T) {
	for _, model := range []string{"gpt2", "llama-3.2-1b"} {
		g, err := Graph(lookup(t, model), Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Attention: Eager, Training: true})
		if err != nil {
			t.Fatal(err)
		}
		inside := map[string]bool{}
		for _, n := range g.Nodes {
			if strings.HasSuffix(n.Module, ".core_attention") {
				name := g.Tensors[n.Out[0]].Name
				inside[name[strings.LastIndex(name, ".")+1:]] = true
			}
			if strings.Contains(n.Module, "core_attention") && n.Kind == "linear" {
				t.Errorf("%s: linear %s inside core_attention", model, n.Module)
			}
		}
		for _, want := range []string{"q_contig", "k_t_contig", "scores", "probs", "v_contig", "context"} {
			if !inside[want] {
				t.Errorf("%s: %s is not in core_attention (have %v)", model, want, inside)
			}
		}
		if inside["merge_heads"] {
			t.Errorf("%s: merge_heads is inside core_attention", model)
		}
	}
}

// Every refused combination fails with one line naming the problem.
func TestParallelRefusals(t *testing.T) {
	odd := lookup(t, "llama-3.2-1b").Clone()
	odd.Intermediate = 8190
	for _, tc := range []struct {
		name, model string
		arch        *models.Arch
		o           Options
		want        string
	}{
		{"TP not dividing heads", "llama-2-7b", nil, Options{TP: 3}, "attention heads (32)"},
		{"TP not dividing KV heads", "llama-3-8b", nil, Options{TP: 16}, "KV heads (8)"},
		{"TP not dividing intermediate", "", odd, Options{TP: 4}, "intermediate size (8190)"},
		{"TP on an encoder", "bert-base", nil, Options{TP: 2}, "decoder families only"},
		{"negative TP", "gpt2", nil, Options{TP: -2}, "must not be negative"},
		{"SP without TP", "gpt2", nil, Options{SP: true}, "sequence parallelism needs tensor parallelism above 1, got 0"},
		{"SP with TP=1", "gpt2", nil, Options{SP: true, TP: 1}, "sequence parallelism needs tensor parallelism above 1, got 1"},
		{"SP not dividing seq", "llama-2-7b", nil, Options{TP: 4, SP: true, Seq: 30}, "sequence parallelism needs tensor parallelism 4 to divide sequence length 30"},
		{"SP with MoE", "mixtral-8x7b", nil, Options{TP: 2, SP: true}, "mixture-of-experts"},
		{"EP on a dense model", "llama-2-7b", nil, Options{EP: 2}, "needs a mixture-of-experts model"},
		{"EP not dividing experts", "mixtral-8x7b", nil, Options{EP: 3}, "expert parallelism 3 does not divide mixtral-8x7b's 8 experts"},
		{"EP with TP", "mixtral-8x7b", nil, Options{EP: 2, TP: 2}, "not modelled"},
		{"QLoRA without LoRA", "llama-2-7b", nil, Options{QLoRA: true}, "QLoRA needs LoRA"},
		{"LoRA rank 0", "llama-2-7b", nil, Options{LoRA: &LoRA{Rank: 0}}, "rank r must be positive"},
		{"LoRA dropout 1", "llama-2-7b", nil, Options{LoRA: &LoRA{Rank: 8, Dropout: 1}}, "dropout"},
		{"LoRA target matches nothing", "llama-2-7b", nil, Options{LoRA: &LoRA{Rank: 8, Targets: []string{"q_proj", "c_attn"}}},
			`LoRA target "c_attn" matches no linear module of llama-2-7b (its linears: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)`},
		{"LoRA qkv parts without a fused qkv", "llama-2-7b", nil, Options{LoRA: &LoRA{Rank: 8, Targets: []string{"q_proj"}, QKV: &[3]bool{true, false, true}}},
			"LoRA qkv= adapts parts of a fused qkv linear, and llama-2-7b has none under this model code"},
	} {
		a := tc.arch
		if a == nil {
			a = lookup(t, tc.model)
		}
		o := tc.o
		o.MicroBatch, o.Training = 1, true
		if o.Seq == 0 {
			o.Seq = 32
		}
		_, err := Graph(a, o)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "") || strings.Contains(msg, "\n") || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: error %q, want one line starting with build: and containing %q", tc.name, msg, tc.want)
		}
	}
}

// Every catalog model builds, lowers and simulates under each option it
// accepts (a smoke test of shapes and the lowering's invariants).
func TestOptionsSmokeAllModels(t *testing.T) {
	for _, name := range models.Names() {
		a := lookup(t, name)
		if a.DenseLayers > 0 {
			// DeepSeek: its dense first layers and two expert layers (the
			// whole V3, 58 layers of 256 experts, took 90 s here).
			a = a.Clone()
			a.Layers = a.DenseLayers + 2
		}
		for _, o := range []Options{
			{TP: 2}, {TP: 2, SP: true}, {TP: 4, MakeVocabDivisibleBy: 128},
			{LoRA: &LoRA{Rank: 8, Dropout: 0.1, Targets: []string{AllLinear}}},
			{LoRA: &LoRA{Rank: 8, Targets: []string{AllLinear}}, QLoRA: true},
			{LoRA: &LoRA{Rank: 8}, TP: 2, SP: true, Precision: ops.AMPBF16},
			{EP: 2}, {TP: 2, Attention: Eager},
		} {
			o.MicroBatch, o.Seq = 1, 16
			if o.Precision == 0 {
				o.Precision = ops.BF16
			}
			o.Training = true
			g, err := Graph(a, o)
			if err != nil {
				continue // refused combinations are covered by TestParallelRefusals
			}
			p, err := lower.Train(g, lower.TrainConfig{Optimizer: lower.AdamW, Precision: o.Precision})
			if err != nil {
				t.Fatalf("%s %+v: %v", name, o, err)
			}
			if err := p.Verify(); err != nil {
				t.Fatalf("%s %+v: %v", name, o, err)
			}
			if _, err := sim.Run(p); err != nil {
				t.Fatalf("%s %+v: %v", name, o, err)
			}
			if a.Encoder {
				continue
			}
			o.Training, o.SP, o.KVContext = false, false, 32
			if g, err = Graph(a, o); err != nil {
				t.Fatalf("%s inference %+v: %v", name, o, err)
			}
			if p, err = lower.Infer(g); err != nil {
				t.Fatalf("%s inference %+v: %v", name, o, err)
			}
			if err := p.Verify(); err != nil {
				t.Fatalf("%s inference %+v: %v", name, o, err)
			}
		}
	}
}
