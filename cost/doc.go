// Package cost is memplan's time model: pure functions that turn work into
// durations, used to price memory-saving strategies (recomputation costs
// compute, offloading costs host-link transfers that may overlap compute,
// sharding costs collectives).
//
//   - Price: a program's step time, each op priced with the formulas below
//     and placed on the compute, copy or communication streams.
//   - Roofline: per-op time as the larger of compute time and DRAM time,
//     scaled by an explicit Efficiency (default: ideal roofline).
//   - Transfer, Overlap and Prefetch: copies over a Link and a two-stream
//     (compute + copy) schedule reporting total and exposed transfer time.
//   - Cost: collectives (ring all-reduce, all-gather and reduce-scatter,
//     pairwise all-to-all) under the alpha–beta model (Thakur, Rabenseifner
//     & Gropp 2005), with NCCL-tests' bus bandwidth factors.
//   - TokensPerSecond, SamplesPerSecond, MFU.
//
// Every function validates its arguments and returns errors wrapping
// ErrInvalid; none performs I/O.
package cost
