package build

import (
	"reflect"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// tensorShape is the shape of the first tensor named name (full path).
func tensorShape(t *testing.T, g *ir.Graph, name string) []int64 {
	t.Helper()
	for i := range g.Tensors {
		if g.Tensors[i].Name == name {
			return g.Tensors[i].Shape
		}
	}
	t.Fatalf("no tensor %q", name)
	return nil
}

// DeepSeek's layers (deepseek.go): latent attention's modules and state
// widths (queries and keys of nope+rope = 192, values of 128), a dense MLP
// in the first first_k_dense_replace layers, routed plus shared experts
// after.
func TestDeepSeekLayers(t *testing.T) {
	a := lookup(t, "deepseek-v2-lite")
	g, err := Graph(a, Options{MicroBatch: 2, Seq: 32, Training: true, Precision: ops.BF16})
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]bool{}
	for _, id := range g.Params {
		params[g.Tensors[id].Name] = true
	}
	for _, p := range []string{
		"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
		"model.layers.0.self_attn.kv_a_layernorm.weight", "model.layers.0.self_attn.kv_b_proj.weight",
		"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
		"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.63.down_proj.weight",
		"model.layers.1.mlp.shared_experts.down_proj.weight",
	} {
		if !params[p] {
			t.Errorf("no parameter %s", p)
		}
	}
	if params["model.layers.0.mlp.gate.weight"] || params["model.layers.1.mlp.gate_proj.weight"] {
		t.Error("layer 0 must be dense and layer 1 an expert layer (first_k_dense_replace 1)")
	}
	for name, want := range map[string][]int64{
		"model.layers.0.self_attn.query_states": {2, 16, 32, 192},
		"model.layers.0.self_attn.key_states":   {2, 16, 32, 192},
		"model.layers.0.self_attn.sdpa":         {2, 16, 32, 128},
		"model.layers.0.self_attn.merge_heads":  {2, 32, 16, 128},
	} {
		if got := tensorShape(t, g, name); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: shape %v, want %v", name, got, want)
		}
	}
	v3 := lookup(t, "deepseek-v3")
	if k := kinds(mustGraph(t, v3, Options{MicroBatch: 1, Seq: 8, Precision: ops.BF16, Attention: Eager}), "model.layers.3.self_attn"); k["matmul"] != 2 || k["softmax"] != 1 {
		t.Errorf("eager MLA: %v, want two matmuls and a softmax", k)
	}
}

func mustGraph(t *testing.T, a *models.Arch, o Options) *ir.Graph {
	t.Helper()
	g, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Inference caches what transformers' DynamicCache holds for DeepSeek: the
// uncompressed key states (192 wide) and value states (128) of every head;
// vLLM's compressed latent is serve's (models.Arch.KVCacheElems).
func TestDeepSeekInferenceCache(t *testing.T) {
	a := lookup(t, "deepseek-v2-lite")
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, KVContext: 64, Precision: ops.BF16})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]int64{
		"model.layers.5.self_attn.k_cache": {1, 16, 64, 192},
		"model.layers.5.self_attn.v_cache": {1, 16, 64, 128},
	} {
		if got := tensorShape(t, g, name); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: shape %v, want %v", name, got, want)
		}
	}
}

// Under TP the query and key/value up-projections and the MLPs are split,
// the down-projections replicated; a TP that does not divide the dense
// layers' width is refused naming it.
func TestDeepSeekTensorParallel(t *testing.T) {
	a := lookup(t, "deepseek-v2-lite")
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Training: true, Precision: ops.BF16, TP: 2})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]int64{
		"model.layers.0.self_attn.q_proj.weight":             {16 * 192 / 2, 2048},
		"model.layers.0.self_attn.kv_a_proj_with_mqa.weight": {576, 2048},
		"model.layers.0.self_attn.kv_b_proj.weight":          {16 * 256 / 2, 512},
		"model.layers.0.self_attn.o_proj.weight":             {2048, 16 * 128 / 2},
		"model.layers.0.mlp.gate_proj.weight":                {10944 / 2, 2048},
		"model.layers.1.mlp.shared_experts.up_proj.weight":   {2 * 1408 / 2, 2048},
	} {
		if got := tensorShape(t, g, name); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: shape %v, want %v", name, got, want)
		}
	}
	b := a.Clone()
	b.DenseIntermediate = 10945
	if _, err := Graph(b, Options{MicroBatch: 1, Seq: 16, Training: true, Precision: ops.BF16, TP: 2}); err == nil || !strings.Contains(err.Error(), "dense-layer intermediate size") {
		t.Errorf("TP 2 over a dense width of 10945: %v", err)
	}
}
