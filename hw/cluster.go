package hw

import (
	"fmt"
	"math"
	"time"

	"github.com/memplan/memplan/internal/yamlerr"
)

// Cluster is what a cluster file (memplan --cluster FILE) says about the
// nodes a job runs on:
//
//	gpus_per_node: 8        # GPUs of one node (optional: the GPU catalog's, else 8)
//	inter_node:
//	  gbps: 400             # each GPU's link to other nodes, Gb/s per direction
//	  latency_us: 5         # optional: per ring step that crosses nodes, µs
//
// Unknown keys are errors.
type Cluster struct {
	GPUsPerNode int
	// InterNodePerDirection is bytes/s per GPU and per direction.
	InterNodePerDirection float64
	InterNodeLatency      time.Duration
}

// A cluster file's numbers are bounded to what a link or a node can be: a
// link of 1e-300 Gb/s timed a step past what a time.Duration holds, and
// plan printed that maximum (2562047h47m16s) as the step time. The slowest
// link taken is 0.1 Gb/s (the slowest Ethernet still sold carries 1 Gb/s),
// the fastest 100,000 Gb/s (a GPU's NVLink 5 is 14,400 Gb/s); a node holds
// at most 4096 GPUs (an NVL576 rack holds 576); a ring step's latency is at
// most a second.
const (
	MinInterNodeGbps = 0.1
	MaxInterNodeGbps = 100000
	MaxGPUsPerNode   = 4096
)

// maxClusterBytes bounds what a cluster file's aliases may expand it to: the
// size the CLI reads it under (boundedio.SmallFile).
const maxClusterBytes = 1 << 20

// ParseCluster reads a cluster file; errors name the file's keys.
func ParseCluster(data []byte) (Cluster, error) {
	var raw struct {
		GPUsPerNode *int `json:"gpus_per_node"`
		InterNode   *struct {
			Gbps      *float64 `json:"gbps"`
			LatencyUs float64  `json:"latency_us"`
		} `json:"inter_node"`
	}
	if err := yamlerr.UnmarshalStrict(data, &raw, maxClusterBytes); err != nil {
		return Cluster{}, fmt.Errorf("not a cluster file: %s", yamlerr.Message(err))
	}
	var c Cluster
	if raw.GPUsPerNode != nil {
		if n := *raw.GPUsPerNode; n < 1 || n > MaxGPUsPerNode {
			return Cluster{}, fmt.Errorf("gpus_per_node must be between 1 and %d, got %d", MaxGPUsPerNode, n)
		}
		c.GPUsPerNode = *raw.GPUsPerNode
	}
	in := raw.InterNode
	if in == nil || in.Gbps == nil {
		return Cluster{}, fmt.Errorf("inter_node.gbps is required (each GPU's link to other nodes, Gb/s per direction)")
	}
	if g := *in.Gbps; math.IsNaN(g) || math.IsInf(g, 0) || g < MinInterNodeGbps || g > MaxInterNodeGbps {
		return Cluster{}, fmt.Errorf("inter_node.gbps must be between %v and %v Gb/s, got %v", MinInterNodeGbps, MaxInterNodeGbps, g)
	}
	if l := in.LatencyUs; math.IsNaN(l) || math.IsInf(l, 0) || l < 0 || l > 1e6 {
		return Cluster{}, fmt.Errorf("inter_node.latency_us must be between 0 and 1000000, got %v", l)
	}
	c.InterNodePerDirection = *in.Gbps * 1e9 / 8
	c.InterNodeLatency = time.Duration(math.Round(in.LatencyUs * 1e3))
	return c, nil
}
