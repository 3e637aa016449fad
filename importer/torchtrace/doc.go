// Package torchtrace reads memplan.trace/v1 and v2 documents — one PyTorch training
// step recorded aten op by aten op by python/memplan_torch (see
// docs/trace-format.md) — and replays them as an ir.Program at any batch and
// sequence length, with gradient accumulation, the first step's lazy
// optimizer state, or a different optimizer.
//
// The replay has the recorded lifetimes exactly: every storage is allocated by
// the op that created it and listed in the In of the op after which PyTorch
// freed it, so the simulator (which frees a storage after its last use)
// reproduces the allocator's live bytes op for op. Parse never panics on bad
// input: every problem is one error line naming the field
// (`trace.json: events[12].alloc[0]: missing "bytes_per_batch"`).
//
// The package does no I/O beyond Load and never imports sim.
package torchtrace
