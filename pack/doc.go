// Package pack places GPU jobs by their memory curves and compares the
// policies schedulers use: a GPU per job, a static size per job, the sum
// of each process's peak, and the curve read through PyTorch's caching
// allocator. It also runs a stream of job arrivals through each policy.
//
// # What a job needs (Envelope)
//
// Every process runs on one GPU. A job of several GPUs (dp × tp × pp of a
// training job, tp of a service, a published row measured on several GPUs)
// is a gang: one process per rank, each with its own envelope (a pipeline
// stage is planned on its own, engine.Options.Stages; the ranks of one
// stage — tensor shards, data-parallel replicas, ZeRO shards — are alike,
// as the engine shards evenly), placed all or none on distinct GPUs, on one
// node of the pool when the job says same-node, and started in the
// simulation only when every rank has a GPU. A process's device memory is the CUDA
// context (outside PyTorch's allocator: the recipe's cuda.overhead, 400 MB
// in the hf recipe, from PyTorch issues #107667/#109888) plus what its
// caching allocator holds. memplan plans the job (engine.Plan: one
// iteration op by op, on the roofline's time axis) and replays it through
// the allocator model (allocator.ReplayProgram), which gives three numbers
// and the curves behind them:
//
//   - Allocated: context + the highest allocated bytes. Less than this and
//     the job cannot run, however memory is shared.
//   - Peak: context + the reserved peak. PyTorch's caching allocator keeps
//     the segments it frees (reserved memory only grows without
//     torch.cuda.empty_cache), so after its first steps a process holds
//     this much for the rest of its run: its device curve is flat at the
//     peak even though its allocated curve rises and falls every step.
//   - Cap: context + the smallest per-process limit
//     (torch.cuda.set_per_process_memory_fraction) under which the
//     allocator survives both replayed iterations: at the limit it frees
//     its own cache and retries instead of failing
//     (c10/cuda/CUDACachingAllocator.cpp alloc_block and
//     release_cached_blocks), so the limit sits between Allocated and Peak.
//
// # Policies
//
//   - whole-gpu: one job per GPU (Kubernetes' nvidia.com/gpu is an integer;
//     containers do not share GPUs).
//   - static: one number per job, the size the user declared (HAMi's
//     nvidia.com/gpumem, gpushare's aliyun.com/gpu-mem) or else the static
//     model_size: the weights at 2 bytes per parameter, the figure the seed
//     document says a scheduler records ("model_size = X GB"; "BF16 推理主要是约
//     2 bytes/parameter 的模型权重") and warns against ("调度器不能用一个静态的
//     model_size 来判断训练任务能否放下"). It counts no CUDA context.
//   - peaks: the sum of the processes' Peaks. Safe with stock processes.
//   - curve: the sum of the processes' Caps, each process run under its
//     limit (Envelope.Fraction). Its combined curve (the processes' curves
//     under their limits) never exceeds the capacity.
//
// A policy's GPUs needed counts the processes it places, past the pool's
// end too, but not those no GPU holds as it counts them (TooLarge): curve's
// saving against a policy (Result.Saved) is given only where the two leave
// out the same processes, since GPUs needed for different jobs measure no
// saving; Result.NotCompared says why it is not otherwise.
//
// Phases of co-located jobs: stock processes run their steps at their own
// pace, so their relative phases drift and every alignment of their curves
// eventually happens; the worst case of the combined curve is the sum of
// the peaks of the curves. A phase offset saves memory only where it is
// held (a co-location runtime that synchronises steps and shares one pool,
// as Zico does) — not modelled here. The combined curves Pack reports
// start every period at 0 to show the shapes, and the statuses use the
// worst case.
//
// # Status of a GPU
//
// ok: what the processes can hold (Caps under curve, Peaks otherwise) fits;
// at-risk: only the allocated peaks fit, so the job survives only if the
// other processes' allocators happen not to have cached what it needs;
// oom: even the allocated peaks exceed the capacity — when the drifting
// phases meet, a process runs out of memory.
//
// Pack and Simulate are functions of jobs (or envelopes), a pool and
// options to a result with JSON tags; they do no I/O besides the files a
// job file names, which ReadFile reads.
package pack
