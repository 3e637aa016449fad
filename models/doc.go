// Package models is memplan's model front end: it turns a HuggingFace
// config.json, or the name of a model in the embedded catalog, into a
// normalized architecture description (Arch) with an exact parameter count.
//
// Entry points:
//
//   - ParseHFConfig / LoadFile parse a config.json (gpt2, llama, mistral,
//     mixtral, qwen2, qwen3, qwen3_moe, gemma, gemma2, gemma3_text, phi,
//     phi3, gpt_neox, falcon, deepseek_v2, deepseek_v3, bert, vit).
//   - Lookup / Names / Catalog / Suggest use the embedded catalog of real
//     configs (gpt2 ... mixtral-8x7b, bert-base, vit-base).
//   - Resolve accepts either a path or a catalog name.
//   - Arch.ParamCount and Arch.ParamBreakdown count parameters exactly as the
//     checkpoint's PyTorch module holds them (tied weights once, buffers such
//     as GPT-2's causal mask excluded).
//
// The package builds no graphs; it only describes architectures. Every error
// it returns is one line prefixed "models:", and no input makes it panic.
package models
