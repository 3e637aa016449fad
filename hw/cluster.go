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
		if *raw.GPUsPerNode < 1 {
			return Cluster{}, fmt.Errorf("gpus_per_node must be at least 1, got %d", *raw.GPUsPerNode)
		}
		c.GPUsPerNode = *raw.GPUsPerNode
	}
	in := raw.InterNode
	if in == nil || in.Gbps == nil {
		return Cluster{}, fmt.Errorf("inter_node.gbps is required (each GPU's link to other nodes, Gb/s per direction)")
	}
	if g := *in.Gbps; math.IsNaN(g) || math.IsInf(g, 0) || g <= 0 {
		return Cluster{}, fmt.Errorf("inter_node.gbps must be a positive number, got %v", g)
	}
	if l := in.LatencyUs; math.IsNaN(l) || math.IsInf(l, 0) || l < 0 || l > 1e6 {
		return Cluster{}, fmt.Errorf("inter_node.latency_us must be between 0 and 1000000, got %v", l)
	}
	c.InterNodePerDirection = *in.Gbps * 1e9 / 8
	c.InterNodeLatency = time.Duration(math.Round(in.LatencyUs * 1e3))
	return c, nil
}
