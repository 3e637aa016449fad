package k8s

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/units"
)

// Labels GPU feature discovery sets on a node (NVIDIA/k8s-device-plugin
// internal/lm/resource.go @ aaccdfd2, baseLabeler).
const (
	ProductLabel = "nvidia.com/gpu.product"
	CountLabel   = "nvidia.com/gpu.count"
	// MemoryLabel is each GPU's memory in MiB, NVML's total (a few hundred
	// MiB over what CUDA lets a process allocate: 81559 on an H100 SXM).
	MemoryLabel = "nvidia.com/gpu.memory"
	// GPUResource is the device plugin's extended resource: a pod that
	// limits it without a workload annotation holds whole GPUs.
	GPUResource corev1.ResourceName = "nvidia.com/gpu"
	maxGPUs                         = 1024
)

// ErrNoGPUs marks a node without GPU feature discovery's labels: not a
// GPU node, or one GFD has not labelled.
var ErrNoGPUs = errors.New("no GPU labels")

// NodeGPUs is a node's GPUs: the catalog entry of their product and how
// many. Every problem names the label.
type NodeGPUs struct {
	GPU   *hw.GPU
	Count int
}

// GPUsOf reads a node's GPUs from its labels.
func GPUsOf(node *corev1.Node) (NodeGPUs, error) {
	product, ok := node.Labels[ProductLabel]
	if !ok {
		return NodeGPUs{}, fmt.Errorf("%w: node has no %s label", ErrNoGPUs, ProductLabel)
	}
	if strings.Contains(product, "-MIG-") {
		return NodeGPUs{}, fmt.Errorf("label %s=%s is a MIG device; memplan places processes on whole GPUs", ProductLabel, cut(product))
	}
	// A time-sliced GPU keeps its name with -SHARED appended
	// (resourceLabeler.getProductName).
	name := strings.TrimSuffix(product, "-SHARED")
	g, err := hw.Lookup(name)
	if err != nil {
		return NodeGPUs{}, fmt.Errorf("label %s=%s names no GPU of memplan's catalog (see 'memplan gpus')", ProductLabel, cut(product))
	}
	c, ok := node.Labels[CountLabel]
	if !ok {
		return NodeGPUs{}, fmt.Errorf("node has %s but no %s label", ProductLabel, CountLabel)
	}
	n, err := strconv.Atoi(c)
	if err != nil || n < 1 || n > maxGPUs {
		return NodeGPUs{}, fmt.Errorf("label %s=%s is not a GPU count between 1 and %d", CountLabel, cut(c), maxGPUs)
	}
	if err := checkMemoryLabel(node); err != nil {
		return NodeGPUs{}, err
	}
	return NodeGPUs{GPU: g, Count: n}, nil
}

// checkMemoryLabel refuses a node whose nvidia.com/gpu.memory label is not
// a GPU's memory in MiB: a positive whole number no larger than the largest
// GPU of the catalog holds. The GPU's memory comes from the catalog entry
// of its product, not from this label, so a value such as 0, -5 or
// 999999999999 said the node was mislabelled and was silently passed over;
// it is a reason the node is unresolvable, as a bad count or product is.
// A node without the label (GFD before it wrote one, a node labelled by
// hand) is read from its product alone.
func checkMemoryLabel(node *corev1.Node) error {
	v, ok := node.Labels[MemoryLabel]
	if !ok {
		return nil
	}
	top := maxMemoryMiB()
	if m, err := strconv.ParseInt(v, 10, 64); err != nil || m < 1 || m > top {
		return fmt.Errorf("label %s=%s is not a GPU memory in MiB between 1 and %d", MemoryLabel, cut(v), top)
	}
	return nil
}

// maxMemoryMiB is the most memory a GPU of the catalog has (its
// datasheet's or its usable, whichever is more) in MiB, with a GiB to
// spare and rounded up to a whole GiB: NVML's total, which GFD writes, is
// up to about half a GiB over the usable (81559 MiB against 81090 on an
// H100 SXM).
var maxMemoryMiB = sync.OnceValue(func() int64 {
	var top units.Bytes
	for _, g := range hw.All() {
		top = max(top, g.Memory, g.TotalMemory)
	}
	const gib = 1 << 30
	return int64((top+2*gib-1)/gib) * 1024
})

// wholeGPUs is how many GPUs a pod limits (nvidia.com/gpu, the device
// plugin's integer resource), over its containers and the largest init
// container as the scheduler counts a pod's requests.
func wholeGPUs(p *corev1.Pod) int64 {
	var sum, initMax int64
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Limits[GPUResource]; ok && q.Value() > 0 {
			// Saturate: two limits of 2^63-1 once summed to -2 (0 GPUs).
			sum = min(sum, math.MaxInt64-q.Value()) + q.Value()
		}
	}
	for _, c := range p.Spec.InitContainers {
		if q, ok := c.Resources.Limits[GPUResource]; ok {
			initMax = max(initMax, q.Value())
		}
	}
	return max(sum, initMax)
}

func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
