package serve

import (
	"time"

	"github.com/memplan/memplan/units"
)

// Timing is the roofline (ideal efficiency: an upper bound on speed) of
// one GPU of the TP group.
type Timing struct {
	// TTFT is the prefill of one prompt of Spec.Prompt tokens: the larger
	// of its matmul and attention FLOPs at the GPU's peak and one read of
	// the weights, plus two ring all-reduces of the hidden states per layer
	// under TP.
	TTFT time.Duration
	// DecodeBatch is the concurrent sequences decoding together (the
	// requests of Spec.Context tokens the KV cache holds, at most
	// max_num_seqs); DecodeStep the time of one decode step: every step
	// reads the weights and the KV cache of the batch.
	DecodeBatch int64
	DecodeStep  time.Duration
	// DecodeTokensPerSec is DecodeBatch / DecodeStep, for the whole TP
	// group; PerRequestTokensPerSec is one request's rate.
	DecodeTokensPerSec     float64
	PerRequestTokensPerSec float64
	// ComputeDType is what the matmuls run in (FP8 weights on a GPU with FP8
	// arithmetic, else the serving dtype).
	ComputeDType units.DType
}

// roofline prices prefill and decode on s.GPU (in float64: FLOPs and bytes
// of any size, no wrap); a TTFT or step longer than a time.Duration holds
// (292 years) is refused naming --prompt or --context.
func roofline(s *Spec, r *Result) (*Timing, error) {
	g, a, t := s.GPU, s.Model, float64(s.TP)
	cd := s.DType
	if s.Quant == FP8 && g.FP8 > 0 {
		cd = units.FP8
	}
	peak := g.PeakFLOPs(cd)
	if peak <= 0 || g.MemBandwidth <= 0 {
		return nil, nil
	}
	// Matmul FLOPs per token on one rank: 2 per active weight (MoE: top-k
	// experts of E), the LM head only for the sampled token.
	active := float64(activeParams(s)) / t
	L, q := float64(a.Layers), float64(a.QDim())/t
	P := float64(s.Prompt)
	// Causal attention: QKᵀ and PV over half the P×P scores, 2 FLOPs a
	// multiply-add each.
	prefillFLOPs := 2*active*P + 2*L*P*P*q
	weightRead := float64(r.Weights) / g.MemBandwidth
	prefill := max(prefillFLOPs/peak, weightRead) + allReduce(s, P)
	if !durationOK(prefill) {
		return nil, bad(FieldPrompt, "{prompt} %d of %s takes %.3g s to prefill on the %s, over the 292 years a time holds", s.Prompt, a.Name, prefill, g.Name)
	}
	tm := &Timing{TTFT: seconds(prefill), ComputeDType: cd}
	B := min(max(r.ConcurrencyAtContext, 1), int64(s.MaxNumSeqs))
	C := float64(s.Context)
	kvRead := float64(B) * C / float64(s.BlockSize) * float64(r.BlockBytes) / g.MemBandwidth
	decodeFLOPs := float64(B) * (2*active + 4*L*C*q)
	step := max(decodeFLOPs/peak, weightRead+kvRead) + allReduce(s, float64(B))
	if !durationOK(step) {
		return nil, bad(FieldContext, "a decode step of %d requests at {context} %d of %s takes %.3g s on the %s, over the 292 years a time holds", B, s.Context, a.Name, step, g.Name)
	}
	tm.DecodeBatch, tm.DecodeStep = B, seconds(step)
	tm.DecodeTokensPerSec = float64(B) / step
	tm.PerRequestTokensPerSec = 1 / step
	return tm, nil
}

// activeParams is the weights one token multiplies by: every layer (top-k
// experts of a MoE) and the LM head.
// Bounded by the parameter count (≤ 10^15, the parser's limit).
func activeParams(s *Spec) int64 {
	a := s.Model
	var n int64
	for _, g := range a.ParamBreakdown() {
		switch g.Name {
		case "embeddings":
			// a lookup, no matmul
		case "mlp":
			if a.NumExperts > 0 {
				per := g.Total / int64(a.NumExperts)
				n += per * int64(max(a.ExpertsPerToken, 1))
				continue
			}
			n += g.Total
		default:
			n += g.Total
		}
	}
	if a.TieEmbeddings {
		n += int64(a.Vocab) * int64(a.Hidden)
	}
	return n
}

// allReduce is two ring all-reduces per layer of tokens×hidden activations
// (after o_proj and down_proj) over NVLink, or PCIe without it: each moves
// 2(t−1)/t of the bytes per direction.
// In float64: no wrap; roofline refuses a total past a time.Duration.
func allReduce(s *Spec, tokens float64) float64 {
	if s.TP < 2 {
		return 0
	}
	g := s.GPU
	bw := g.NVLinkPerDirection()
	if bw <= 0 {
		bw = g.HostLink.PerDirection
	}
	if bw <= 0 {
		return 0
	}
	t := float64(s.TP)
	bytes := tokens * float64(s.Model.Hidden) * float64(s.DType.Bits()) / 8
	return 2 * float64(s.Model.Layers) * 2 * (t - 1) / t * bytes / bw
}

func seconds(x float64) time.Duration { return time.Duration(x * float64(time.Second)) }
