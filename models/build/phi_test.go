package build

import (
	"reflect"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
)

// phiParams maps each parameter name of g to its shape.
func phiParams(g *ir.Graph) map[string][]int64 {
	out := map[string][]int64{}
	for _, id := range g.Params {
		out[g.Tensors[id].Name] = g.Tensors[id].Shape
	}
	return out
}

// The phi graph registers PhiForCausalLM's parameters under transformers'
// names (modeling_phi.py): one input_layernorm per layer, q/k/v_proj and
// dense with bias, fc1/fc2 with bias, final_layernorm and an lm_head with a
// bias.
func TestPhiModulePaths(t *testing.T) {
	a := lookup(t, "phi-1.5").Clone()
	a.Layers = 1
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true})
	if err != nil {
		t.Fatal(err)
	}
	H, I, V := int64(2048), int64(8192), int64(51200)
	want := map[string][]int64{
		"model.embed_tokens.weight":              {V, H},
		"model.layers.0.input_layernorm.weight":  {H},
		"model.layers.0.input_layernorm.bias":    {H},
		"model.layers.0.self_attn.q_proj.weight": {H, H},
		"model.layers.0.self_attn.q_proj.bias":   {H},
		"model.layers.0.self_attn.k_proj.weight": {H, H},
		"model.layers.0.self_attn.k_proj.bias":   {H},
		"model.layers.0.self_attn.v_proj.weight": {H, H},
		"model.layers.0.self_attn.v_proj.bias":   {H},
		"model.layers.0.self_attn.dense.weight":  {H, H},
		"model.layers.0.self_attn.dense.bias":    {H},
		"model.layers.0.mlp.fc1.weight":          {I, H},
		"model.layers.0.mlp.fc1.bias":            {I},
		"model.layers.0.mlp.fc2.weight":          {H, I},
		"model.layers.0.mlp.fc2.bias":            {H},
		"model.final_layernorm.weight":           {H},
		"model.final_layernorm.bias":             {H},
		"lm_head.weight":                         {V, H},
		"lm_head.bias":                           {V},
	}
	if got := phiParams(g); !reflect.DeepEqual(got, want) {
		t.Errorf("phi parameters:\n got %v\nwant %v", got, want)
	}
	// The lm_head applies its bias in the same linear (addmm), and the
	// rotary tables cover partial_rotary_factor 0.5 of the 64-wide heads.
	for _, n := range g.Nodes {
		if n.Module == "lm_head" && n.Kind == "linear" && len(n.In) != 3 {
			t.Errorf("lm_head linear reads %d inputs, want x, weight, bias", len(n.In))
		}
	}
	cos := 0
	for i := range g.Tensors {
		if tt := &g.Tensors[i]; tt.Name == "model.rotary_emb.cos" {
			cos++
			if tt.Shape[len(tt.Shape)-1] != 32 {
				t.Errorf("%s: shape %v, want 32 rotary dims", tt.Name, tt.Shape)
			}
		}
	}
	if cos != 1 {
		t.Errorf("%d model.rotary_emb.cos tables, want 1", cos)
	}
}

// PhiDecoderLayer: attention and MLP both read the one input_layernorm
// output; resid_dropout runs on each branch (two masks) and embed_dropout
// after the embedding.
func TestPhiParallelBlock(t *testing.T) {
	a := lookup(t, "phi-1.5").Clone()
	a.Layers = 1
	a.HiddenDropout, a.EmbdDropout = 0.1, 0.1
	g, err := Graph(a, Options{MicroBatch: 2, Seq: 16, Precision: ops.BF16, Training: true})
	if err != nil {
		t.Fatal(err)
	}
	var ln ir.TensorID = ir.NoTensor
	readers := map[string]bool{}
	drops := map[string]int{}
	for _, n := range g.Nodes {
		switch {
		case n.Kind == "layer_norm" && n.Module == "model.layers.0.input_layernorm":
			ln = n.Out[0]
		case n.Kind == "layer_norm" && strings.HasPrefix(n.Module, "model.layers.0."):
			t.Errorf("second norm in the layer: %s", n.Module)
		case n.Kind == "dropout":
			drops[n.Module]++
		}
		for _, in := range n.In {
			if in == ln && ln != ir.NoTensor {
				readers[n.Module] = true
			}
		}
	}
	for _, m := range []string{"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.fc1"} {
		if !readers[m] {
			t.Errorf("%s does not read input_layernorm's output (readers %v)", m, readers)
		}
	}
	if drops["model.layers.0"] != 2 || drops["model"] != 1 {
		t.Errorf("dropouts per module %v, want 2 in model.layers.0 and embed_dropout in model", drops)
	}
}

// peft's default LoRA targets for phi are q_proj, v_proj, fc1 and fc2; the
// head's bias also counts under TP (vocab-parallel, V/t), with a chunked
// loss, and in KV-cache inference.
func TestPhiVariants(t *testing.T) {
	a := lookup(t, "phi-1.5")
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true, LoRA: &LoRA{Rank: 8, Alpha: 16}})
	if err != nil {
		t.Fatal(err)
	}
	n, names := trainable(g)
	// r·(in+out) per adapter: q, v 8·4096; fc1, fc2 8·10240; 24 layers.
	if want := int64(24 * (2*8*4096 + 2*8*10240)); n != want {
		t.Errorf("LoRA trainable %d, want %d", n, want)
	}
	for _, s := range names {
		if !strings.Contains(s, ".q_proj.") && !strings.Contains(s, ".v_proj.") && !strings.Contains(s, ".fc1.") && !strings.Contains(s, ".fc2.") {
			t.Errorf("unexpected LoRA parameter %s", s)
		}
	}

	g, err = Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true, Loss: Loss{Kind: LossChunked, Chunks: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := graphParams(a, g), a.ParamCount(); got != want {
		t.Errorf("chunked loss: graph has %d parameters, checkpoint %d", got, want)
	}

	for _, sp := range []bool{false, true} {
		g, err = Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Training: true, TP: 2, SP: sp})
		if err != nil {
			t.Fatal(err)
		}
		if s := phiParams(g)["lm_head.bias"]; !reflect.DeepEqual(s, []int64{51200 / 2}) {
			t.Errorf("TP=2 SP=%v: lm_head.bias %v, want [25600]", sp, s)
		}
	}

	g, err = Graph(a, Options{MicroBatch: 1, Seq: 16, KVContext: 64, Precision: ops.BF16})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := graphParams(a, g), a.ParamCount(); got != want {
		t.Errorf("inference: graph has %d parameters, checkpoint %d", got, want)
	}
}
