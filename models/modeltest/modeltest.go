// Package modeltest draws random model architectures for property tests.
package modeltest

import (
	"pgregory.net/rapid"

	"github.com/memplan/memplan/models"
)

// Arch shrinks a random catalog family to a size that simulates fast.
func Arch(t *rapid.T) *models.Arch {
	names := []string{"gpt2", "llama-3.2-1b", "mistral-7b", "qwen3-8b", "gemma-2-9b", "phi-3-mini", "pythia-160m", "mixtral-8x7b", "bert-base", "vit-base"}
	a, err := models.Lookup(rapid.SampledFrom(names).Draw(t, "family"))
	if err != nil {
		t.Fatal(err)
	}
	a = a.Clone()
	hd := rapid.IntRange(1, 4).Draw(t, "headdim") * 8
	a.KVHeads = rapid.IntRange(1, 2).Draw(t, "kvheads")
	a.Heads = a.KVHeads * rapid.IntRange(1, 3).Draw(t, "groups")
	a.HeadDim = hd
	a.Hidden = a.Heads * hd
	if a.Family == models.FamilyGPT2 || a.Family == models.FamilyBERT || a.Family == models.FamilyViT || a.Family == models.FamilyGPTNeoX {
		a.KVHeads = a.Heads
	}
	a.Intermediate = rapid.IntRange(1, 4).Draw(t, "ffn") * 16
	a.Layers = rapid.IntRange(1, 3).Draw(t, "layers")
	if a.Vocab > 0 {
		a.Vocab = rapid.IntRange(8, 300).Draw(t, "vocab")
	}
	if a.MaxPositions > 0 && a.PosEmbedding == models.PosLearned && a.Family != models.FamilyViT {
		a.MaxPositions = 64
	}
	if a.Family == models.FamilyViT {
		a.ImageSize, a.PatchSize = 32, 8
		a.MaxPositions = a.NumPatches() + 1
	}
	if a.NumExperts > 0 {
		a.NumExperts = 4
		a.ExpertsPerToken = 2
	}
	if err := a.Validate(); err != nil {
		t.Fatalf("generated arch invalid: %v", err)
	}
	return a
}

// Fataler is the part of testing.TB the fixed architectures need.
type Fataler interface {
	Fatal(args ...any)
}

// SmallLlama is llama-3.2-1b cut to 3 layers of width 128 (2 heads of 64,
// intermediate 256, vocabulary 512): every parameter's size divides by 64,
// so sharding over up to 64 ranks needs no padding.
func SmallLlama(t Fataler) *models.Arch {
	a, err := models.Lookup("llama-3.2-1b")
	if err != nil {
		t.Fatal(err)
	}
	a = a.Clone()
	a.Hidden, a.Heads, a.KVHeads, a.HeadDim, a.Intermediate, a.Layers, a.Vocab = 128, 2, 2, 64, 256, 3, 512
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	return a
}
