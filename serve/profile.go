package serve

import (
	"github.com/memplan/memplan/units"
)

// profilePeak is the activation peak of vLLM's profile run above the
// weights: one forward over N = max_num_batched_tokens tokens flattened
// into one batch (max_num_seqs prompts of N/max_num_seqs tokens each,
// worker/model_runner.py profile_run), without a KV cache (the attention
// kernel reads q, k, v and writes its output; no scores are materialised),
// then the logits of the last token of every prompt. The decoder layers run
// vLLM's own modules (model_executor/models/llama.py and the families that
// copy it):
//
//   - LlamaDecoderLayer keeps the residual stream and the normed input
//     (fused_add_rms_norm writes both in place) while its attention or MLP
//     runs;
//   - LlamaAttention: qkv = qkv_proj(h) [N, (q+2kv)/tp], rotary applied to
//     q and k in place, attn output [N, q/tp], o_proj output [N, H]; qkv
//     is a live local until forward returns;
//   - LlamaMLP: gate_up = gate_up_proj(x) [N, 2I/tp], x = act_fn(gate_up)
//     [N, I/tp] (SiluAndMul), down_proj output [N, H]; gate_up is a live
//     local until forward returns. A non-gated MLP (fc1 → act → fc2)
//     rebinds its variable, so fc1's output dies after the activation.
//   - FusedMoE (fused_moe.py fused_experts): intermediate_cache1 [N, topk,
//     2I/tp], cache2 [N, topk, I/tp], cache3 [N, topk, H] and the router
//     logits [N, E].
//   - under TP, o_proj and down_proj (RowParallelLinear) all-reduce their
//     [N, H] output out of place, so one more [N, H] is live at each
//     phase's peak (layerElems).
//
// Every activation is in the serving dtype. The logits phase holds the
// final hidden states [N, H] and the logits [S, V] of S = min(max_num_seqs,
// N) rows (LogitsProcessor prunes to the sampled positions, gathered whole
// on the driver rank). The profile logs of vllm-project/vllm#10517 (RTX
// 3090, Llama-3.1-8B: peak_torch_memory − weights = 2.07 GiB at 20000
// tokens, 2.99 GiB at 29000, 0.06 GiB at 512 under chunked prefill) show
// no sampler temporaries beyond the logits.
//
// Bounded (limits.go): N × the widest phase ≤ 2^58 elements
// (validateProducts), S × vpad ≤ 2^20 × 2^24 and N × H ≤ 2^26 × 2^20.
func profilePeak(s *Spec) (units.Bytes, string) {
	a, dt := s.Model, s.DType
	N := int64(s.MaxNumBatchedTokens)
	attn, mlp := layerElems(s)
	S := min(int64(s.MaxNumSeqs), N)
	vpad := ceilDiv(int64(a.Vocab), vocabPadding) * vocabPadding
	logits := dt.Size(N*int64(a.Hidden)) + dt.Size(S*vpad)
	reduced := ""
	if s.TP > 1 {
		reduced = " and its all-reduced copy"
	}
	layer, where := dt.Size(N*attn), "attention (qkv, output and o_proj output"+reduced+")"
	if m := dt.Size(N * mlp); m > layer {
		layer, where = m, "mlp (gate_up, activation and down_proj output"+reduced+")"
	}
	if logits > layer {
		return logits, "logits of the sampled positions"
	}
	return layer, where
}

// layerElems is the elements one token keeps live in a decoder layer's
// attention phase and in its MLP phase (profilePeak says which).
// Each is at most 2^37 under the parser's limits (q, kv ≤ 2^14 heads ×
// 2^20 head_dim; k·(3·I + H) ≤ 2^12 · 2^22; experts ≤ 2^12).
func layerElems(s *Spec) (attn, mlp int64) {
	a, t := s.Model, int64(s.TP)
	H, I := int64(a.Hidden), int64(a.Intermediate)
	q := int64(a.QDim())
	kv := int64(kvHeadsPerRank(s)) * int64(a.HeadDim)
	stream := 2 * H // residual + normed input
	attn = stream + (q/t + 2*kv) + q/t + H
	switch {
	case a.NumExperts > 0:
		k := int64(max(a.ExpertsPerToken, 1))
		mlp = stream + k*(2*I/t+I/t+H) + int64(a.NumExperts)*2 // router logits in float32 = 2 elements of 16 bits
	case a.GatedMLP:
		mlp = stream + 2*I/t + I/t + H
	default:
		mlp = stream + 2*I/t
	}
	if a.ParallelResidual {
		// Parallel attention and MLP (GPT-NeoX, Phi): the attention output
		// lives while the MLP runs.
		mlp += H
	}
	if t > 1 {
		// Under TP the row-parallel o_proj and down_proj end in an
		// all-reduce that vLLM makes out of place (GroupCoordinator.all_reduce,
		// vllm/distributed/parallel_state.py @v0.7.1: "PyTorch custom ops
		// do not support mutation ... So we always make the all-reduce
		// operation out-of-place"; pynccl's all_reduce allocates its output
		// with torch.empty_like): the projection's [N, H] output and the
		// reduced copy are live together.
		attn += H
		mlp += H
	}
	return attn, mlp
}

// perTokenDecode is the activation bytes of one decoded token (the widest
// layer phase), which sizes the CUDA-graph pool.
func perTokenDecode(s *Spec) units.Bytes {
	attn, mlp := layerElems(s)
	return s.DType.Size(max(attn, mlp))
}

// graphPool estimates the memory CUDA-graph capture keeps: V0 captures
// decode graphs of the model's forward (logits are computed outside the
// graph) from the largest batch (min(max_num_seqs, 256)) down, sharing one
// memory pool, so the pool holds the activations of the largest batch
// (model_runner.py capture_model, graph_memory_pool).
// Bounded: 256 sequences × perTokenDecode (≤ 2^37 elements of ≤ 4 bytes).
func graphPool(s *Spec) units.Bytes {
	b := int64(min(s.MaxNumSeqs, maxGraphBatch))
	return units.Bytes(b) * perTokenDecode(s)
}
