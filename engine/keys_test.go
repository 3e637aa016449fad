package engine

import (
	"reflect"
	"sort"
	"testing"

	"github.com/memplan/memplan/internal/fieldpath"
)

// specFields lists every leaf field of Spec with why the cache's key
// (Spec.preShardKey) ignores it, or "" where the key carries it. A field
// added to Spec fails TestKeysCoverEverySpecField until it is listed here:
// its author decides whether the program before sharding depends on it
// (the search's keys have their own test, search.TestKeysIgnoreOnlyWhatTheySay).
var specFields = map[string]string{
	"Job.Model": "", "Job.Trace": "", "Job.TraceOptimizer": "", "Job.Mode": "",
	"Job.MicroBatch": "", "Job.Seq": "", "Job.Accum": "", "Job.Precision": "", "Job.Optimizer": "", "Job.Impl": "",
	"Job.Attention": "", "Job.Device": "", "Job.GenTokens": "", "Job.LoRA": "", "Job.QLoRA": "",
	"Job.Count.Measured": "", "Job.Count.MinBytes": "", "Job.Count.Granularity": "", "Job.Count.Scratch": "", "Job.Count.WholeBatch": "",

	"Sem.Recipe": "", "Sem.Code": "", "Sem.FusedSwiGLU": "", "Sem.GroupedExperts": "", "Sem.MLALatentCache": "", "Sem.HandSiLU": "", "Sem.HandSoftmax": "", "Sem.RepeatKV": "", "Sem.EagerRMSNorm": "", "Sem.RMSNormFP32Weight": "", "Sem.EagerGELU": "", "Sem.MeanSavesInput": "", "Sem.OutOfPlaceSums": "",
	"Sem.Loss.Kind": "", "Sem.Loss.ChunkTokens": "", "Sem.Loss.Chunks": "", "Sem.Loss.Upcast": "", "Sem.Loss.Rows": "",
	"Sem.LoRAModelDType": "", "Sem.LoRASharedDropout": "",
	"Sem.Quant.NF4.SavesInput": "", "Sem.Quant.NF4.DequantCopy": "", "Sem.Quant.NoDoubleQuant": "", "Sem.Quant.TargetsOnly": "",
	"Sem.Quant.FP32Rest": "", "Sem.Quant.Head": "",
	"Sem.PagedOptimizer": "", "Sem.OptimizerInBackward": "", "Sem.StateDType": "", "Sem.Hold": "", "Sem.ZeroGrad": "",
	"Sem.Workspace": "", "Sem.FSDPFlat": "", "Sem.CommOverhead": "", "Sem.Overhead": "", "Sem.AllocConf": "",

	"Parallel.TP": "", "Parallel.EP": "", "Parallel.SP": "", "Parallel.PP": "", "Parallel.PPInterleave": "", "Parallel.PPSchedule": "",
	"Parallel.Sharding.DP":              "sharding is applied to the cached program (Cache.post), keyed by its own Sharding",
	"Parallel.Sharding.ZeRO":            "as DP (FSDP1's flat parameters, which change the graph, are the key's flat)",
	"Parallel.Sharding.ZeROBucketElems": "as DP",

	"Savings.Checkpoint.Kind": "", "Savings.Checkpoint.Every": "", "Savings.Checkpoint.Modules": "",
	"Savings.Offload.Activations": "offload is applied to the cached (sharded) program",
	"Savings.Offload.Optimizer":   "as Activations",
	"Savings.Offload.Params":      "as Activations",

	"Target.GPU":                 "the target judges and prices the program; the GPU's cuBLAS workspace reaches the program through Sem.Workspace, resolved by Validate",
	"Target.Capacity":            "as GPU (auto checkpointing, which plans against it, is not cached)",
	"Target.FirstStep":           "a key says which iteration it holds (cacheKey.first)",
	"Target.HostMemory":          "as GPU: the host limit judges the simulated program",
	"Target.GPUsPerNode":         "as HostMemory; it also places the ranks on nodes, which prices, never builds, the program",
	"Target.InterNode.Bandwidth": "as GPU: the inter-node link prices the program's collectives, it never changes the program",
	"Target.InterNode.Latency":   "as InterNode.Bandwidth",
}

func TestKeysCoverEverySpecField(t *testing.T) {
	if !reflect.TypeOf(Spec{}).Comparable() {
		t.Fatal("Spec must be comparable: its keys are Specs")
	}
	leaves := fieldpath.Leaves(reflect.TypeOf(Spec{}))
	seen := map[string]bool{}
	for _, l := range leaves {
		seen[l.Path] = true
		why, listed := specFields[l.Path]
		if !listed {
			t.Errorf("Spec.%s is not in specFields: say whether the cache's key (preShardKey) carries it", l.Path)
			continue
		}
		var s Spec
		base := s.preShardKey()
		fieldpath.Change(&s, l)
		changed := s.preShardKey() != base
		switch {
		case why == "" && !changed:
			t.Errorf("Spec.%s: the cache's key ignores it, but specFields says the key carries it", l.Path)
		case why != "" && changed:
			t.Errorf("Spec.%s: the cache's key carries it, but specFields says it is ignored (%s)", l.Path, why)
		}
	}
	var stale []string
	for p := range specFields {
		if !seen[p] {
			stale = append(stale, p)
		}
	}
	sort.Strings(stale)
	for _, p := range stale {
		t.Errorf("specFields lists %s, which is not a field of Spec", p)
	}
}
