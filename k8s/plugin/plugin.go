// Package plugin is memplan's scheduler-framework plugin: Filter, Score
// and Reserve over package k8s's judgement of a node's GPUs, built into a
// kube-scheduler binary (cmd/kube-scheduler) as kubernetes-sigs/
// scheduler-plugins builds its plugins. It lives in its own Go module so
// that memplan's main module does not pull k8s.io/kubernetes.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/k8s"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/units"
)

// Name is the plugin's name in a scheduler profile.
const Name = "MemplanGPU"

// Args are the plugin's arguments (pluginConfig args in the profile).
type Args struct {
	// Policy: curve (default) or peaks.
	Policy string `json:"policy,omitempty"`
	// Margin kept free on every GPU, e.g. "1GiB".
	Margin string `json:"margin,omitempty"`
	// Refs is the directory plan: and snapshot: references are read from.
	Refs string `json:"refs,omitempty"`
}

// Plugin judges nodes by the GPUs their pods' envelopes leave free.
type Plugin struct {
	handle  fwk.Handle
	planner *k8s.Planner

	mu sync.Mutex
	// reserved: the GPU each pod was reserved on (its node's index),
	// until it is unreserved; the framework's snapshot holds the assumed
	// pod on its node, this holds which GPU.
	reserved map[types.UID]int
}

var (
	_ fwk.FilterPlugin  = (*Plugin)(nil)
	_ fwk.ScorePlugin   = (*Plugin)(nil)
	_ fwk.ReservePlugin = (*Plugin)(nil)
)

// New builds the plugin from its args (a *runtime.Unknown holding Args'
// JSON, or nil for the defaults).
func New(_ context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	var a Args
	if u, ok := obj.(*runtime.Unknown); ok && u != nil && len(u.Raw) > 0 {
		if err := strictJSON(u.Raw, &a); err != nil {
			return nil, fmt.Errorf("%s args: %s", Name, yamlerr.Message(err))
		}
	}
	pol := pack.Curve
	if a.Policy != "" {
		p, err := pack.ParsePolicy(a.Policy)
		if err != nil || (p != pack.Curve && p != pack.Peaks) {
			return nil, fmt.Errorf("%s args: policy %q: want curve or peaks", Name, a.Policy)
		}
		pol = p
	}
	var m units.Bytes
	if a.Margin != "" {
		var err error
		if m, err = units.ParseBytesOrZero(a.Margin); err != nil {
			return nil, fmt.Errorf("%s args: margin %q: want a size such as 1GiB, or 0", Name, a.Margin)
		}
	}
	pl := &Plugin{handle: h, reserved: map[types.UID]int{}}
	pl.planner = &k8s.Planner{Policy: pol, Margin: m, Refs: a.Refs, Pinned: pl.pinned}
	return pl, nil
}

// Name is the plugin's name.
func (pl *Plugin) Name() string { return Name }

func (pl *Plugin) pinned(p *corev1.Pod) (int, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	g, ok := pl.reserved[p.UID]
	return g, ok
}

// judge is the planner's verdict on pod at ni, planning its workload under
// ctx, the scheduling cycle's: a cycle the scheduler abandons stops the
// planning (unless another cycle waits for the same envelope) and is the
// pod's error, not a verdict on the node.
func (pl *Plugin) judge(ctx context.Context, pod *corev1.Pod, ni fwk.NodeInfo) (*k8s.Verdict, *fwk.Status) {
	w, err := pl.planner.WorkloadOf(pod)
	if err != nil {
		// A pod whose annotation does not parse is an error for that pod:
		// the scheduler records it and retries the pod; nothing crashes.
		return nil, fwk.AsStatus(err)
	}
	if w == nil {
		return nil, nil
	}
	node := ni.Node()
	if node == nil {
		return nil, fwk.AsStatus(errors.New("node not found"))
	}
	var pods []*corev1.Pod
	for _, pi := range ni.GetPods() {
		q := pi.GetPod()
		if q.UID == pod.UID {
			continue
		}
		if q.Spec.NodeName == "" {
			c := *q
			c.Spec.NodeName = node.Name
			q = &c
		}
		pods = append(pods, q)
	}
	v, err := pl.planner.JudgeContext(ctx, w, node, pods)
	if err != nil {
		return nil, fwk.AsStatus(err)
	}
	return &v, nil
}

// Filter refuses a node whose GPUs cannot hold the pod's envelope beside
// what runs there: Unschedulable when preempting pods could make room,
// UnschedulableAndUnresolvable when the node has no GPUs memplan knows.
// A pod without the annotation passes.
func (pl *Plugin) Filter(ctx context.Context, _ fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) *fwk.Status {
	v, st := pl.judge(ctx, pod, ni)
	if st != nil || v == nil || v.Fits {
		return st
	}
	if v.Unresolvable {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, v.Reason)
	}
	return fwk.NewStatus(fwk.Unschedulable, v.Reason)
}

// Score is how full the GPU the pod lands on is then, 0 to MaxNodeScore:
// the tightest fit highest.
func (pl *Plugin) Score(ctx context.Context, _ fwk.CycleState, pod *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	v, st := pl.judge(ctx, pod, ni)
	if st != nil || v == nil {
		return 0, st
	}
	return v.Score(fwk.MaxNodeScore), nil
}

// ScoreExtensions: scores are already 0..MaxNodeScore.
func (pl *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve records the GPU the pod takes on the node, so the next pods are
// judged with it pinned there.
func (pl *Plugin) Reserve(ctx context.Context, _ fwk.CycleState, pod *corev1.Pod, nodeName string) *fwk.Status {
	ni, err := pl.handle.SnapshotSharedLister().NodeInfos().Get(nodeName)
	if err != nil {
		return fwk.AsStatus(err)
	}
	v, st := pl.judge(ctx, pod, ni)
	if st != nil || v == nil {
		return st
	}
	if !v.Fits {
		return fwk.NewStatus(fwk.Unschedulable, v.Reason)
	}
	pl.mu.Lock()
	pl.reserved[pod.UID] = v.GPU
	pl.mu.Unlock()
	return nil
}

// Unreserve forgets the pod's GPU.
func (pl *Plugin) Unreserve(_ context.Context, _ fwk.CycleState, pod *corev1.Pod, _ string) {
	pl.mu.Lock()
	delete(pl.reserved, pod.UID)
	pl.mu.Unlock()
}

// Reserved is the GPU a pod was reserved on.
func (pl *Plugin) Reserved(uid types.UID) (int, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	g, ok := pl.reserved[uid]
	return g, ok
}
