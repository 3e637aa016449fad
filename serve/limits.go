package serve

import (
	"math"

	"github.com/memplan/memplan/units"
)

// Serving's sizes are products of a model's dimensions (models' parser
// bounds each: hidden, intermediate and head_dim 2^20, heads 2^14, layers
// 2^12, experts 2^12, vocabulary 2^24, parameters 10^15) and the flags
// (--max-num-batched-tokens and --max-model-len 2^26, --max-num-seqs 2^20,
// --block-size 2^16, --tp at most the heads). Each product below is either
// bounded by those (said where it is computed) or checked here, before
// anything is priced; issue 15: a config of 16384 heads of head_dim 2^20
// at 2^26 batched tokens reported a 48 GiB activation peak (the attention
// phase's 2^62 elements wrapped) and a block of 0 bytes.
const (
	// maxElements bounds one activation of the profile run and the KV
	// entries of one block (2^58: 8-byte elements stay under MaxBytes/2).
	maxElements = 1 << 58
	// maxSeconds is the longest step or TTFT a time.Duration holds.
	maxSeconds = math.MaxInt64 / 1e9
)

// validateProducts checks the profile run's widest activation
// (--max-num-batched-tokens × the elements a token keeps live in a layer
// phase or the logits) and one KV block (--block-size × every layer's key
// and value entries of a token) against maxElements.
func (s *Spec) validateProducts() error {
	a := s.Model
	attn, mlp := layerElems(s) // ≤ 2^37: q/t + 2·kv + 5·H with q, kv ≤ 2^34, or k·(3·I + H) ≤ 2^34
	per := max(attn, mlp, int64(a.Hidden))
	if _, ok := units.MulChecked(int64(s.MaxNumBatchedTokens), per, maxElements); !ok {
		return bad(FieldBatchedTokens, "{max-num-batched-tokens} %d × %d elements a token keeps live in a layer of %s is over the limit of 2^58 elements in one activation of the profile run (2^58 fp32 elements are 1 EiB): no GPU holds it",
			s.MaxNumBatchedTokens, per, a.Name)
	}
	if _, ok := units.MulChecked(int64(s.BlockSize), kvElemsPerToken(s), maxElements); !ok {
		return bad(FieldBlockSize, "{block-size} %d × %d KV-cache elements per token of %s is over the limit of 2^58 elements in one block: no GPU holds it",
			s.BlockSize, kvElemsPerToken(s), a.Name)
	}
	return nil
}

// kvElemsPerToken is the KV-cache entries of one token over every layer on
// one rank (≤ 2 · 2^14 · 2^20 · 2^12 = 2^47).
func kvElemsPerToken(s *Spec) int64 {
	a := s.Model
	if a.MLA() {
		return int64(a.KVCacheElems()) * int64(a.Layers)
	}
	return 2 * int64(kvHeadsPerRank(s)) * int64(a.HeadDim) * int64(a.Layers)
}

// durationOK says whether x seconds fit a time.Duration (292 years): a
// step longer is refused, not converted into a wrapped, negative time.
func durationOK(x float64) bool { return !math.IsNaN(x) && x >= 0 && x <= maxSeconds }
