package ir

import (
	"maps"
	"slices"
)

// SameButNames says whether a and b are the same computation but for
// names: node for node and tensor for tensor equal in every field but a
// tensor's Name and a node's Module (two pipeline stages of like layers
// differ only in the layer numbers their names carry).
// TestSameButNamesReadsEveryField keeps it reading every field.
func SameButNames(a, b *Graph) bool {
	if len(a.Tensors) != len(b.Tensors) || len(a.Nodes) != len(b.Nodes) || a.Loss != b.Loss ||
		!slices.Equal(a.Params, b.Params) || !slices.Equal(a.Inputs, b.Inputs) ||
		!slices.Equal(a.Buffers, b.Buffers) || !slices.Equal(a.Outputs, b.Outputs) {
		return false
	}
	for i := range a.Tensors {
		if !sameTensor(&a.Tensors[i], &b.Tensors[i]) {
			return false
		}
	}
	for i := range a.Nodes {
		if !sameNode(&a.Nodes[i], &b.Nodes[i]) {
			return false
		}
	}
	return true
}

func sameTensor(x, y *Tensor) bool {
	return slices.Equal(x.Shape, y.Shape) && x.Bytes == y.Bytes && x.Base == y.Base && x.DType == y.DType && x.Cat == y.Cat &&
		x.Resident == y.Resident && x.Keep == y.Keep && x.Host == y.Host && x.RequiresGrad == y.RequiresGrad &&
		x.Batch == y.Batch && x.Carried == y.Carried && x.AutocastCached == y.AutocastCached
}

func sameNode(x, y *Node) bool {
	return x.Kind == y.Kind && slices.Equal(x.In, y.In) && slices.Equal(x.Out, y.Out) && slices.Equal(x.Saved, y.Saved) &&
		x.Workspace == y.Workspace && x.FLOPs == y.FLOPs && x.MemBytes == y.MemBytes && x.BwdWorkspace == y.BwdWorkspace &&
		x.BwdFLOPs == y.BwdFLOPs && x.GradAliases == y.GradAliases && maps.Equal(x.GradSaved, y.GradSaved) &&
		slices.Equal(x.NoGrad, y.NoGrad) && sameComm(x.Comm, y.Comm) && sameComm(x.BwdComm, y.BwdComm)
}

func sameComm(x, y *Comm) bool {
	return x == y || x != nil && y != nil && *x == *y
}
