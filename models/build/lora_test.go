package build

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

func TestParseLoRA(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want LoRA
	}{
		{"r=16,alpha=32,dropout=0.05,targets=q_proj+v_proj", LoRA{Rank: 16, Alpha: 32, Dropout: 0.05, Targets: []string{"q_proj", "v_proj"}}},
		{"r=16,targets=q_proj,v_proj", LoRA{Rank: 16, Alpha: 8, Targets: []string{"q_proj", "v_proj"}}},
		{"targets=q_proj,v_proj,r=4", LoRA{Rank: 4, Alpha: 8, Targets: []string{"q_proj", "v_proj"}}},
		{"targets=all-linear", LoRA{Rank: 8, Alpha: 8, Targets: []string{"all-linear"}}},
		{" r = 2 , dropout=0 ", LoRA{Rank: 2, Alpha: 8}},
		{"", LoRA{Rank: 8, Alpha: 8}},
		{"targets=qkv_proj,qkv=q+v", LoRA{Rank: 8, Alpha: 8, Targets: []string{"qkv_proj"}, QKV: &[3]bool{true, false, true}}},
		{"qkv=K,targets=qkv_proj", LoRA{Rank: 8, Alpha: 8, Targets: []string{"qkv_proj"}, QKV: &[3]bool{false, true, false}}},
	} {
		got, err := ParseLoRA(tc.in)
		if err != nil {
			t.Errorf("ParseLoRA(%q): %v", tc.in, err)
			continue
		}
		if got.Rank != tc.want.Rank || got.Alpha != tc.want.Alpha || got.Dropout != tc.want.Dropout || strings.Join(got.Targets, "|") != strings.Join(tc.want.Targets, "|") ||
			(got.QKV == nil) != (tc.want.QKV == nil) || got.QKV != nil && *got.QKV != *tc.want.QKV {
			t.Errorf("ParseLoRA(%q) = %+v, want %+v", tc.in, *got, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"r=0", `r must be a positive integer, got "0"`},
		{"r=-4", `r must be a positive integer`},
		{"r=x", `r must be a positive integer`},
		{"rank2=3", `unknown key "rank2"`},
		{"r=8,foo=1", `unknown key "foo"`},
		{"q_proj", `"q_proj" is not key=value`},
		{"r=8,q_proj", `"q_proj" is not key=value`},
		{"dropout=1.5", `dropout must be a number in [0, 1)`},
		{"alpha=-1", `alpha must be a positive number`},
		{"targets=", `targets needs at least one module name`},
		{"r=4,r=8", `key "r" given twice`},
		{"qkv=q+x", `qkv takes q, k and v joined by +`},
		{"qkv=", `qkv takes q, k and v joined by +`},
		{"qkv=query", `qkv takes q, k and v joined by +`},
		{"qkv=q+q", `qkv names "q" twice`},
	} {
		_, err := ParseLoRA(tc.in)
		if err == nil || !strings.HasPrefix(err.Error(), "LoRA: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseLoRA(%q): error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

// trainable counts the parameter elements that take a gradient.
func trainable(g *ir.Graph) (n int64, names []string) {
	for _, id := range g.Params {
		if tt := &g.Tensors[id]; tt.RequiresGrad {
			n += tt.Numel()
			names = append(names, tt.Name)
		}
	}
	return n, names
}

// peft's print_trainable_parameters for Llama-2-7B: r=8 on q_proj and v_proj
// gives "trainable params: 4,194,304 || all params: 6,742,609,920"; r=16 is
// twice that, and all-linear r=16 (q,k,v,o,gate,up,down) 39,976,960.
func TestLoRATrainableParams(t *testing.T) {
	a := lookup(t, "llama-2-7b")
	for _, tc := range []struct {
		lora LoRA
		want int64
	}{
		{LoRA{Rank: 8, Targets: []string{"q_proj", "v_proj"}}, 4_194_304},
		{LoRA{Rank: 16, Targets: []string{"q_proj", "v_proj"}}, 8_388_608},
		{LoRA{Rank: 16}, 8_388_608}, // peft's default targets for llama
		{LoRA{Rank: 16, Targets: []string{"all-linear"}}, 39_976_960},
	} {
		l := tc.lora
		g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true, LoRA: &l})
		if err != nil {
			t.Fatal(err)
		}
		n, names := trainable(g)
		if n != tc.want {
			t.Errorf("LoRA %+v: %d trainable parameters, want %d", l, n, tc.want)
		}
		if all := graphParams(a, g) - n; all != a.ParamCount() {
			t.Errorf("LoRA %+v: %d base parameters, want %d", l, all, a.ParamCount())
		}
		for _, name := range names {
			if !strings.Contains(name, ".lora_A.default.weight") && !strings.Contains(name, ".lora_B.default.weight") {
				t.Errorf("LoRA %+v: %s is trainable", l, name)
			}
		}
	}
	// all-linear takes the Mixtral router (an nn.Linear) but never the LM head.
	l := LoRA{Rank: 4, Targets: []string{AllLinear}}
	g, err := Graph(lookup(t, "mixtral-8x7b"), Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true, LoRA: &l})
	if err != nil {
		t.Fatal(err)
	}
	_, names := trainable(g)
	joined := strings.Join(names, " ")
	if !strings.Contains(joined, "block_sparse_moe.gate.lora_A") || strings.Contains(joined, "lm_head") {
		t.Errorf("all-linear on mixtral: router adapted %v, lm_head adapted %v", strings.Contains(joined, "block_sparse_moe.gate.lora_A"), strings.Contains(joined, "lm_head"))
	}
}

// derivatives.yaml mm: a frozen base linear saves no input (only lora_A
// does, through its dropout output); non-target linears save no input
// either; frozen parameters get no gradient and no optimizer state.
func TestLoRASavesAndStates(t *testing.T) {
	a := lookup(t, "llama-3.2-1b")
	l := &LoRA{Rank: 16, Dropout: 0.05, Targets: []string{"q_proj", "v_proj"}}
	o := Options{MicroBatch: 2, Seq: 64, Precision: ops.FP32, Training: true, LoRA: l}
	g, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	savesActivation := func(n *ir.Node) bool {
		for _, s := range n.Saved {
			if g.Tensors[ir.Storage(g.Tensors, s)].Cat != ir.Parameter {
				return true
			}
		}
		return false
	}
	seen := map[string]bool{}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Kind != "linear" || !strings.HasPrefix(n.Module, "model.layers.1.") {
			continue
		}
		leaf := n.Module[len("model.layers.1."):]
		seen[leaf] = true
		switch {
		case strings.HasSuffix(leaf, ".lora_A.default"):
			var acts []string
			for _, s := range n.Saved {
				if g.Tensors[s].Cat != ir.Parameter {
					acts = append(acts, g.Tensors[s].Name)
				}
			}
			if want := "model.layers.1.self_attn." + strings.Split(leaf, ".")[1] + ".lora_dropout.default.out"; len(acts) != 1 || acts[0] != want {
				t.Errorf("%s saves activations %v, want %s only", leaf, acts, want)
			}
		case strings.HasSuffix(leaf, ".lora_B.default"):
			if !savesActivation(n) {
				t.Errorf("%s saves no input", leaf)
			}
		default:
			if savesActivation(n) {
				t.Errorf("frozen %s saves an activation", leaf)
			}
		}
	}
	for _, want := range []string{"self_attn.q_proj.base_layer", "self_attn.k_proj", "mlp.down_proj", "self_attn.v_proj.lora_A.default"} {
		if !seen[want] {
			t.Errorf("no linear at %s (have %v)", want, seen)
		}
	}
	n, _ := trainable(g)
	_, r := simulate(t, a, o)
	if got, want := r.ModelStates.Gradients, units.F32.Size(n); got != want {
		t.Errorf("gradients %d bytes, want %d (LoRA parameters only)", got, want)
	}
	if got, want := r.ModelStates.OptimizerState, units.F32.Size(2*n); got != want {
		t.Errorf("AdamW state %d bytes, want %d (LoRA parameters only)", got, want)
	}
}

// QLoRA (Dettmers et al. 2023, §2): 4-bit NF4 weights with double
// quantisation cost 4 + 8/64 + 32/(64·256) = 4.127 bits per parameter of
// every linear of the transformer body; embeddings, norms and the LM head
// stay bf16; the adapters are float32 (peft's autocast_adapter_dtype).
func TestQLoRABytesLlama2_7B(t *testing.T) {
	a := lookup(t, "llama-2-7b")
	l := &LoRA{Rank: 16, Targets: []string{"q_proj", "v_proj"}}
	_, r := simulate(t, a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, LoRA: l, QLoRA: true})
	H, I, V, L := int64(a.Hidden), int64(a.Intermediate), int64(a.Vocab), int64(a.Layers)
	linear := L * (4*H*H + 3*H*I)
	bits := 4 + 8.0/64 + 32.0/(64*256)
	quant := float64(linear) * bits / 8
	other := 2 * (2*V*H + (2*L+1)*H)
	lora := 4 * L * 2 * 16 * (H + H)
	want := quant + float64(other+lora)
	got := float64(r.ModelStates.Parameters)
	t.Logf("llama-2-7b QLoRA parameters: %.0f bytes (%.3f GiB): NF4 + constants %.0f, bf16 %d, adapters %d", got, got/(1<<30), quant, other, lora)
	if got != want {
		t.Errorf("QLoRA llama-2-7b parameter bytes %.0f, want %.0f", got, want)
	}
	if r.Params != a.ParamCount()+lora/4 {
		t.Errorf("%d parameter elements, want %d", r.Params, a.ParamCount()+lora/4)
	}
	// Each frozen linear dequantises into a bf16 temporary in forward and
	// again in backward.
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true, LoRA: l, QLoRA: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range g.Nodes {
		if n.Kind == "linear_4bit" && n.Module == "model.layers.2.mlp.down_proj" {
			if want := units.BF16.Size(H * I); n.Workspace != want || n.BwdWorkspace != want {
				t.Errorf("down_proj dequantisation workspace %d / %d, want %d", n.Workspace, n.BwdWorkspace, want)
			}
		}
	}
}

// LoRA composes with tensor and sequence parallel: a column-parallel base
// keeps lora_A whole and shards lora_B, a row-parallel one the reverse.
func TestLoRATensorParallel(t *testing.T) {
	a := lookup(t, "llama-2-7b")
	l := &LoRA{Rank: 16, Targets: []string{"q_proj", "o_proj"}}
	_, r := simulate(t, a, Options{MicroBatch: 1, Seq: 32, Precision: ops.BF16, LoRA: l, TP: 4, SP: true})
	if r.Params == 0 {
		t.Fatal("no parameters")
	}
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 32, Precision: ops.BF16, Training: true, LoRA: l, TP: 4})
	if err != nil {
		t.Fatal(err)
	}
	shapes := map[string][]int64{}
	for _, id := range g.Params {
		shapes[g.Tensors[id].Name] = g.Tensors[id].Shape
	}
	p := "model.layers.0.self_attn."
	for name, want := range map[string][]int64{
		p + "q_proj.lora_A.default.weight": {16, 4096}, p + "q_proj.lora_B.default.weight": {1024, 16},
		p + "o_proj.lora_A.default.weight": {16, 1024}, p + "o_proj.lora_B.default.weight": {4096, 16},
	} {
		if !equalShape(shapes[name], want) {
			t.Errorf("%s: %v, want %v", name, shapes[name], want)
		}
	}
}

// Under litgpt's code, --lora without targets is litgpt's default adapter
// (lora_query and lora_value on the fused qkv: finetune/lora.py @8641822),
// not peft's q_proj/v_proj, which litgpt's model does not have. On
// llama-2-7b at r 16: lora_A 2·16×4096 and lora_B 8192×16 per layer, 32
// layers = 8,388,608, the same as peft's q_proj+v_proj adapters.
func TestLoRALitGPTDefaultTargets(t *testing.T) {
	a := lookup(t, "llama-2-7b")
	count := func(l LoRA) (int64, string) {
		g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true, LoRA: &l, Code: CodeLitGPT})
		if err != nil {
			t.Fatal(err)
		}
		n, names := trainable(g)
		return n, strings.Join(names, " ")
	}
	def := LoRA{Rank: 16}
	got, names := count(def)
	want, _ := count(LoRA{Rank: 16, Targets: []string{"qkv_proj"}, QKV: &[3]bool{true, false, true}})
	if got != 8_388_608 || got != want || !strings.Contains(names, "qkv_proj.lora_A") {
		t.Errorf("litgpt default: %d trainable (%s), want %d = explicit qkv_proj with qkv=q+v", got, names[:min(len(names), 120)], want)
	}
	if def.QKV != nil || def.Targets != nil {
		t.Errorf("the caller's LoRA was changed: %+v", def)
	}
}
