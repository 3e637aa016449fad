// Package ckpt places activation checkpoints on a chain of blocks (the
// layers of a transformer, the stages of a ResNet) at per-block
// granularity, the way torch.utils.checkpoint is applied to each layer: a
// Policy says which blocks run checkpointed, and the solvers pick the one
// with the least recomputation whose peak memory fits a budget.
//
// # Memory model
//
// Block i (0 ≤ i < n) has an input activation of Input_i bytes, holds Saved_i
// bytes for its backward when it is not checkpointed (its input included, so
// Saved_i ≥ Input_i; its output is the next block's input and is counted
// there), needs Peak_i transient bytes while its backward runs, and costs
// Forward_i to run forward. At the forward/backward boundary block j holds
//
//	held_j = Input_j  if j is checkpointed  (torch.utils.checkpoint keeps only the inputs)
//	held_j = Saved_j  otherwise.
//
// Backward runs blocks n−1 down to 0 and frees block j's memory after its
// backward. When block i's backward runs its Saved_i is live (already held,
// or rematerialised by re-running its forward, which recomputes everything
// but the input it kept) on top of what earlier blocks still hold, plus its
// transient Peak_i, so the peak is
//
//	peak = max over i of  Σ_{j<i} held_j + Saved_i + Peak_i
//
// and the extra compute is Σ Forward_i over checkpointed blocks. Evaluate
// computes exactly this; it is the single source of truth the solvers and
// tests are checked against. The forward pass never exceeds it as long as a
// block's forward transient is at most Saved_i + Peak_i (at block i the
// forward holds Σ_{j<i} held_j plus block i's working set), and the state at
// the boundary, Σ_j held_j, is at most the term for i = n−1. Memory outside
// the chain (parameters, gradients, optimizer state, the loss and logits) is
// not modelled: pass the budget left for activations. Checkpointing the last
// block never lowers the peak (its backward rematerialises Saved at once), so
// the solvers keep it.
//
// # Solvers
//
// Optimal (and OptimalWith) is an exact dynamic program. With E_i the extra
// bytes held before block i because earlier blocks are kept (Σ of
// Saved_j − Input_j over kept j < i), block i fits iff E_i ≤ cap_i = budget −
// Σ_{j<i} Input_j − Saved_i − Peak_i; since E only grows along the chain
// this is E_i ≤ lim_i = min_{k≥i} cap_k, a non-decreasing staircase, and the
// problem is a 0/1 knapsack (keep block j: weight Saved_j − Input_j, value
// Forward_j) whose capacity grows with the prefix. The DP runs over
// (block, held bytes) in O(n·M) time with M = lim_{n−1}/r + 1 memory slots
// of r bytes, using O(M) floats and n·M bits to reconstruct the policy. Sizes
// are rounded conservatively (weights up, capacities down), so the policy
// always fits; it is exactly optimal when every Saved − Input is a multiple
// of r, and otherwise no worse than the exact optimum under budget − n·r.
// The automatic resolution uses the greatest common divisor of the blocks'
// Saved − Input (exact) when that needs at most 1<<24 cells, and otherwise
// DefaultResolution(budget) = max(1 MiB, budget/16384): at most 16385 slots,
// ~16M cells for 1,000 blocks. Options.Resolution overrides it. A final
// exact-bytes greedy pass re-keeps blocks where the rounding left room.
// (The general problem is weakly NP-hard: a single capacity is knapsack.)
//
// OptimalExact solves the same problem over exact bytes with a Pareto-front
// DP (exponential in the worst case); BruteForce enumerates all policies for
// n ≤ 20. Both are references for tests.
//
// Chen and ChenGreedy are the baselines of Chen et al., "Training Deep Nets
// with Sublinear Memory Cost" (2016): the √n rule and the budgeted greedy of
// its Algorithm 3, rendered per block (see their comments).
//
// Griewank and Walther's Revolve bound — with s checkpoint slots and at most
// t recomputations of each step a chain of C(s+t, s) steps can be reversed —
// is about multi-level recomputation, where a stored state is re-advanced
// several times. Per-block checkpointing recomputes each block at most once
// (t = 1) and keeps every block boundary, so that bound does not apply here
// and is not tested. Rotor (Beaumont et al., TOMS 2024) solves that richer
// schedule space with an O(L³·M) DP; the per-block space needs only O(L·M).
package ckpt
