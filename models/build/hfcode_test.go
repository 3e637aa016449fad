package build

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
)

// kinds counts g's nodes by kind under the module prefix.
func kinds(g *ir.Graph, prefix string) map[string]int {
	out := map[string]int{}
	for _, n := range g.Nodes {
		if strings.HasPrefix(n.Module, prefix) {
			out[n.Kind]++
		}
	}
	return out
}

// savedBytes is what the graph's nodes under prefix save for backward.
func savedBytes(g *ir.Graph, prefix string) int64 {
	seen := map[ir.TensorID]bool{}
	var n int64
	for _, nd := range g.Nodes {
		if !strings.HasPrefix(nd.Module, prefix) {
			continue
		}
		for _, id := range nd.Saved {
			if !seen[id] {
				seen[id] = true
				n += int64(g.Tensors[id].Bytes)
			}
		}
	}
	return n
}

// transformers' code as export-hf traces it (python/tests/test_export_hf.py compares whole programs; these
// check each mechanism on its own, without PyTorch).
func TestTransformersCodeMechanisms(t *testing.T) {
	const B, S = 2, 32
	build := func(name string, o Options) *ir.Graph {
		t.Helper()
		o.MicroBatch, o.Seq, o.Training, o.Precision = B, S, true, ops.FP32
		g, err := Graph(lookup(t, name), o)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// gelu_new: NewGELUActivation keeps x, 0.5*x, tanh and 1+tanh where one fused GELU keeps x
	gpt2 := lookup(t, "gpt2")
	F := int64(gpt2.Intermediate) * B * S * 4
	fused := savedBytes(build("gpt2", Options{}), "transformer.h.0.mlp")
	eager := savedBytes(build("gpt2", Options{EagerGELU: true}), "transformer.h.0.mlp")
	if eager-fused != 3*F {
		t.Errorf("gelu_new eager saves %d bytes more than fused, want 3 x %d", eager-fused, F)
	}
	// q by torch.cat (GPT-NeoX's partial rotary): SDPA's output is copied before the dense projection
	if k := kinds(build("pythia-160m", Options{}), "gpt_neox.layers.0.attention"); k["copy"] != 1 || k["sdpa_flash"] != 1 {
		t.Errorf("GPT-NeoX attention: %v, want one sdpa_flash and one copy (merge_heads)", k)
	}
	if k := kinds(build("llama-3.2-1b", Options{}), "model.layers.0.self_attn"); k["copy"] != 0 {
		t.Errorf("Llama attention copies %d tensors, want none (q is a transposed view)", k["copy"])
	}
	// Gemma2 runs eager attention under transformers' code
	if k := kinds(build("gemma-2-9b", Options{}), "model.layers.0.self_attn"); k["sdpa_flash"] != 0 || k["softmax"] != 1 {
		t.Errorf("Gemma2 attention: %v, want eager (softmax, no sdpa_flash)", k)
	}
	// CPU kernels with attention dropout: SDPA's math path (GPT-2: attn_pdrop 0.1)
	k := kinds(build("gpt2", Options{Device: ops.CPU}), "transformer.h.0.attn")
	if k["sdpa_flash"] != 0 || k["softmax"] != 1 || k["dropout"] != 2 || k["matmul"] != 2 {
		t.Errorf("GPT-2 attention on CPU kernels: %v, want the math path (two matmuls, softmax, attention and residual dropout)", k)
	}
	if k := kinds(build("gpt2", Options{}), "transformer.h.0.attn"); k["sdpa_flash"] != 1 {
		t.Errorf("GPT-2 attention on CUDA kernels: %v, want sdpa_flash", k)
	}
}
