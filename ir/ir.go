// Package ir is memplan's tensor-level intermediate representation of one
// training or inference iteration.
//
// A Graph is the forward computation as a model builder writes it: tensors
// and nodes, each node knowing what autograd saves for its backward. A
// Program is the whole iteration lowered to a straight line of ops (forward,
// loss, backward, optimizer step, repeated micro-steps) that the simulator
// walks. Lifetimes are not stored: a storage is allocated by the first op
// that writes it and freed after the last op that touches it, unless it is
// resident. Views and in-place results share their base's storage.
package ir

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/units"
)

// TensorID indexes Graph.Tensors / Program.Tensors.
type TensorID int32

// NoTensor marks "none" (for example a tensor that owns its storage has
// Base == NoTensor).
const NoTensor TensorID = -1

// Category is a line of the memory ledger.
type Category uint8

// Ledger categories, in the order reports stack them.
const (
	Parameter Category = iota
	Gradient
	OptimizerState
	Activation // saved for backward
	Temporary  // intermediates, activation gradients, workspaces
	KVCache
	Other // inputs, labels, buffers
	NumCategories
)

var categoryNames = [NumCategories]string{"parameters", "gradients", "optimizer_state", "activations", "temporaries", "kv_cache", "other"}

// String returns the JSON key of the category ("optimizer_state").
func (c Category) String() string {
	if c < NumCategories {
		return categoryNames[c]
	}
	return fmt.Sprintf("category(%d)", c)
}

// Phase of the iteration an op runs in. The loss belongs to the forward
// phase, as PyTorch's memory tools count it.
type Phase uint8

// Phases in execution order.
const (
	Forward Phase = iota
	Backward
	Optimizer
	NumPhases
)

var phaseNames = [NumPhases]string{"forward", "backward", "optimizer"}

func (p Phase) String() string {
	if p < NumPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", p)
}

// AutocastExit names the op that ends an autocast region
// (strategy.AutocastCache): it reads the region's cached weight copies,
// which die after it, and launches no kernel.
const AutocastExit = "autocast.exit"

// Tensor is a value in the graph. A tensor either owns a storage of Bytes
// bytes (Base == NoTensor) or aliases the storage of Base (a view or the
// result of an in-place op; its Bytes are 0). (Fields are ordered to pack:
// programs copy tensors by the thousand.)
type Tensor struct {
	Name  string
	Shape []int64
	Bytes units.Bytes
	Base  TensorID
	DType units.DType
	Cat   Category
	// Resident storages exist before the iteration starts and are never
	// freed by it (parameters, steady-state optimizer state, inputs).
	Resident bool
	// Keep storages are never freed once written (optimizer state created
	// lazily by the first step).
	Keep bool
	// Host storages live in host memory (offload); they count in the host
	// ledger, not the device one.
	Host bool
	// RequiresGrad marks tensors autograd differentiates (parameters and
	// everything computed from them).
	RequiresGrad bool
	// Batch is true when the size scales with the micro-batch.
	Batch bool
	// Carried storages stand for what the previous iteration left alive
	// into this one (its gradients when the loop zeroes them after the
	// forward, its outputs while a variable holds them): the Keep storages
	// of the same category, when the program has any.
	Carried bool
	// AutocastCached marks torch.autocast's cached lower-precision copy of
	// a trainable float32 parameter (ops.Builder writes it): PyTorch keeps
	// it in a per-thread cache until the outermost autocast region exits,
	// so it lives at least to the end of the region that made it
	// (strategy.AutocastCache reads it there).
	AutocastCached bool
}

// Numel is the product of the shape.
func (t *Tensor) Numel() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Node is one forward op of a Graph.
type Node struct {
	Kind   string // op rule name, e.g. "linear"
	Module string // module path, e.g. "model.layers.3.self_attn"
	In     []TensorID
	Out    []TensorID
	// Saved are the tensors autograd keeps for this node's backward. They
	// may be inputs, outputs or extra outputs (masks, statistics).
	Saved []TensorID
	// Workspace is scratch memory held only while the op runs.
	Workspace units.Bytes
	FLOPs     float64
	// MemBytes is the memory traffic of the op, for a roofline.
	MemBytes float64
	// Backward describes the gradient op; ignored when no input needs a
	// gradient.
	BwdWorkspace units.Bytes
	BwdFLOPs     float64
	// GradAliases marks view-like nodes whose input gradient is a view of the
	// output gradient (no new storage).
	GradAliases bool
	// GradSaved maps input positions to the index in Saved of the tensor
	// that already is their gradient (kernels that compute gradients in
	// forward, such as a fused linear cross-entropy); backward returns it
	// without a new allocation.
	GradSaved map[int]int
	// NoGrad lists input positions that never get a gradient even if they
	// require one (integer indices, masks).
	NoGrad []int
	// Comm / BwdComm mark collectives in the forward and in this node's
	// backward (tensor parallel's f and g operators: identity one way,
	// all-reduce the other).
	Comm, BwdComm *Comm
}

// Graph is the forward computation of a model.
type Graph struct {
	Tensors []Tensor
	Nodes   []Node
	// Params lists trainable and frozen parameters in registration order.
	Params []TensorID
	// Inputs are the batch's tensors (token ids, labels, images).
	Inputs []TensorID
	// Loss is the scalar the backward starts from (NoTensor for inference).
	Loss TensorID
	// Buffers are resident non-parameter tensors (masks, rotary tables).
	Buffers []TensorID
	// Outputs are what the model returns (logits): a training loop that
	// keeps them in a variable holds them through backward.
	Outputs []TensorID
}

// Op is one step of a Program. (Fields are ordered to pack: programs copy
// ops by the thousand.)
type Op struct {
	Name   string
	Module string
	Micro  int // micro-step index under gradient accumulation
	In     []TensorID
	Out    []TensorID
	// Workspace is allocated when the op starts and freed when it ends.
	Workspace units.Bytes
	// WorkspaceHost is the same on the host side.
	WorkspaceHost units.Bytes
	FLOPs         float64
	MemBytes      float64
	// Comm is set on collective ops (data/tensor/pipeline/expert parallel
	// communication); Transfer on host↔device copies (offload). The
	// simulator treats both as ordinary ops; the cost model prices them.
	Comm     *Comm
	Transfer *Transfer
	// Node is the forward node this op was lowered from, or -1.
	Node  int32
	Phase Phase
	// Recompute marks re-forward ops run inside backward (checkpointing).
	Recompute bool
}

// Label is the op's name, with its module in parentheses when it has one
// ("mm (model.layers.0.mlp)"): how reports name the op at a peak.
func (o *Op) Label() string {
	if o.Module == "" {
		return o.Name
	}
	return o.Name + " (" + o.Module + ")"
}

// CommKind is a collective.
type CommKind uint8

const (
	AllReduce CommKind = iota
	AllGather
	ReduceScatter
	AllToAll
	SendRecv
)

var commNames = []string{"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}

func (k CommKind) String() string {
	if int(k) < len(commNames) {
		return commNames[k]
	}
	return fmt.Sprintf("comm(%d)", k)
}

// Comm describes a collective: its kind, its per-rank buffer in NCCL-tests'
// sense (the full, unsharded buffer of an all-reduce or all-gather output or
// reduce-scatter input), and the process group it runs over. Ops carrying a
// collective list the buffers it reads and writes in In/Out.
type Comm struct {
	Kind  CommKind
	Bytes units.Bytes
	// Group is the process group; Ranks its size.
	Group Group
	Ranks int
}

// Group is a process group a collective runs over.
type Group string

const (
	DataGroup     Group = "dp" // data-parallel replicas (DDP, ZeRO/FSDP)
	TensorGroup   Group = "tp" // tensor (and sequence) parallel ranks
	PipelineGroup Group = "pp" // neighbouring pipeline stages
	ExpertGroup   Group = "ep" // expert-parallel ranks
	ContextGroup  Group = "cp" // context-parallel ranks
)

// Transfer is a copy over the host link.
type Transfer struct {
	Bytes units.Bytes
	// ToHost is device→host (offload); false is host→device (reload).
	ToHost bool
}

// Program is one iteration as a straight line of ops.
type Program struct {
	Tensors []Tensor
	Ops     []Op
	// MicroBatches is the number of accumulated micro-steps.
	MicroBatches int
	// Params are the parameter tensors (for model-state accounting).
	Params []TensorID
	// GradOf pairs each gradient storage with its parameter (gradient →
	// parameter) in programs whose backward ops come from no graph node: a
	// replayed trace, whose exporter records each parameter's .grad. nil:
	// strategies pair them through the nodes.
	GradOf map[TensorID]TensorID
	// SharedTensors: Tensors is another program's array, to be read and
	// never written or appended to (capped at its length). A transform that
	// only inserts ops reading existing tensors (strategy.AutocastCache)
	// makes such a program instead of copying every tensor; one that edits
	// tensors copies them first, and strategy.Release does not recycle
	// them.
	SharedTensors bool
	// SummedGrads: the gradients of a parameter several nodes read (a tied
	// input embedding and LM head) are summed before its one
	// AccumulateGrad, as autograd does on one GPU (lower.bufferGrad). A
	// pipeline holds such a parameter as a copy per stage, each with its
	// own gradient, and needs the program lowered so
	// (lower.TrainConfig.SeparateCopies).
	SummedGrads bool
}

// Storage returns the tensor that owns t's storage.
func Storage(ts []Tensor, t TensorID) TensorID {
	for ts[t].Base != NoTensor {
		t = ts[t].Base
	}
	return t
}

// Storages is Storage of every tensor, in one pass in tensor order: a
// view's base comes first (Verify), so its storage is already known, where
// Storage per tensor walks each chain through the tensor array (6 s of
// cache misses in the pipeline's analysis of deepseek-v3 --pp 4 --accum 8).
// A base that is not earlier is walked.
func Storages(ts []Tensor) []TensorID {
	owner := make([]TensorID, len(ts))
	for i := range ts {
		switch b := ts[i].Base; {
		case b == NoTensor:
			owner[i] = TensorID(i)
		case b >= 0 && int(b) < i:
			owner[i] = owner[b]
		default:
			owner[i] = Storage(ts, TensorID(i))
		}
	}
	return owner
}

// Verify checks the invariants of a Program: ids in range, views point
// backwards to owners, only owners have bytes, every tensor an op reads was
// written earlier or is resident, no storage is written fresh twice.
func (p *Program) Verify() error {
	n := TensorID(len(p.Tensors))
	// The op pass reads a byte per operand, not its tensor (80 bytes, in
	// no order the ops follow): deepseek-v2's 1.6 million ops read 7.2
	// million operands of 2.5 million tensors (BenchmarkVerify).
	const (
		written   = 1 // written by an op, or resident
		rewritten = 2 // may be written again: a view, or resident
	)
	st := make([]uint8, n)
	for i := range p.Tensors {
		t := &p.Tensors[i]
		if t.Base != NoTensor {
			if t.Base < 0 || t.Base >= n {
				return fmt.Errorf("tensor %d (%s): base %d out of range", i, t.Name, t.Base)
			}
			if t.Base >= TensorID(i) {
				return fmt.Errorf("tensor %d (%s): base %d is not earlier", i, t.Name, t.Base)
			}
			if t.Bytes != 0 {
				return fmt.Errorf("view %d (%s) has %d bytes", i, t.Name, t.Bytes)
			}
			st[i] = rewritten
		}
		if t.Bytes < 0 {
			return fmt.Errorf("tensor %d (%s) has negative size", i, t.Name)
		}
		if t.Resident {
			st[i] = written | rewritten
		}
	}
	for oi := range p.Ops {
		op := &p.Ops[oi]
		if op.Workspace < 0 {
			return fmt.Errorf("op %d (%s): negative workspace", oi, op.Name)
		}
		for _, t := range op.In {
			if t < 0 || t >= n {
				return fmt.Errorf("op %d (%s): input %d out of range", oi, op.Name, t)
			}
			if st[t]&written == 0 {
				return fmt.Errorf("op %d (%s) reads %s before it is written", oi, op.Name, p.Tensors[t].Name)
			}
		}
		for _, t := range op.Out {
			if t < 0 || t >= n {
				return fmt.Errorf("op %d (%s): output %d out of range", oi, op.Name, t)
			}
			if st[t] == written {
				return fmt.Errorf("op %d (%s) writes %s a second time", oi, op.Name, p.Tensors[t].Name)
			}
			st[t] |= written
		}
	}
	return nil
}

// ConcurrentOps is the size from which a pass over a program pays for a
// goroutine beside another pass (strategy's pipeline analysis, engine's
// pricing beside the simulation): deepseek-v3's pipeline stages have a
// million ops, fit's shallow programs a few thousand, whose search keeps
// every core busy already.
const ConcurrentOps = 1 << 16

// BlockOf returns the module path of the block that owns path: everything up
// to and including the first numeric component ("model.layers.3.mlp" →
// "model.layers.3"). Paths without an index are returned whole.
func BlockOf(path string) string {
	start := 0
	for start <= len(path) {
		end := strings.IndexByte(path[start:], '.')
		if end < 0 {
			end = len(path)
		} else {
			end += start
		}
		if IsIndex(path[start:end]) {
			return path[:end]
		}
		start = end + 1
	}
	return path
}

// IsIndex reports whether a module path component is a list index: one or
// more ASCII digits ("3" in "model.layers.3").
func IsIndex(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return len(s) > 0
}
