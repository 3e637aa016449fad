// Package k8s places Kubernetes pods on GPU nodes by their memory
// envelopes (package pack): the logic a kube-scheduler extender
// (Extender, over k8s.io/kube-scheduler/extender/v1's types) and a
// scheduler-framework plugin (the separate module under k8s/plugin) share.
//
// A pod declares what it runs in the annotation memplan.io/workload: one
// job of pack's job file (memplan.jobs/v1) without its name — train: or
// serve: in plan's terms (a catalog model and an embedded recipe, never a
// path), or plan: / snapshot: naming a file under the extender's --refs
// directory. A node's GPUs come from the labels NVIDIA's
// GPU feature discovery sets (nvidia.com/gpu.product, nvidia.com/gpu.count;
// NVIDIA/k8s-device-plugin internal/lm/resource.go @ aaccdfd2: the product
// is the NVML name with spaces as dashes, "-SHARED" appended when the GPU
// is time-sliced, "-MIG-<profile>" for a MIG device). What runs there is
// the pods bound to the node: an annotated pod is its envelope on one GPU
// (on the GPU memplan.io/gpu names when it has one), a pod without the
// annotation that limits nvidia.com/gpu holds that many GPUs whole.
//
// Fits decides whether a new envelope fits beside the existing ones under
// pack's peaks or curve policy (each GPU holds the sum of what its
// processes can hold: reserved peaks, or the limits their allocators
// survive under curve), placing the unpinned ones first-fit decreasing as
// pack does and the new one best-fit; the score is how full the GPU it
// lands on is then, so the tightest fit wins.
package k8s
