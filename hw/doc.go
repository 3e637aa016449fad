// Package hw is memplan's embedded catalog of GPUs: memory capacity (both the
// datasheet figure and the usable total_memory a process sees), dense peak
// throughput per dtype, DRAM bandwidth, and host/NVLink bandwidth.
//
// The catalog is data, not code: gpus.yaml, embedded at build time. Every
// number cites the vendor document it comes from; see the comments at the top
// of that file for units and conventions (dense peaks, FP32 accumulate,
// bidirectional NVLink).
package hw
