package plugin

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/queuesort"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
	tf "k8s.io/kubernetes/pkg/scheduler/testing/framework"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/k8s"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/units"
)

// The jobs: memplan pack's vocabulary, as pods annotate them.
var jobs = map[string]string{
	"xl":    "train: {model: gpt2-xl, micro-batch: 4, seq: 1024, precision: amp-bf16, checkpoint: full}",
	"llama": "serve: {model: llama-3-8b, concurrency: 32, context: 2048, gen-tokens: 512}",
	"qwen":  "serve: {model: qwen2.5-7b, concurrency: 64, context: 1024, gen-tokens: 256}",
	"ft":    "train: {model: gpt2, micro-batch: 8, seq: 1024, precision: amp-bf16}",
}

func gpuNode(name string, count int) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		k8s.ProductLabel: "NVIDIA-H100-80GB-HBM3", k8s.CountLabel: fmt.Sprint(count),
	}}, Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{}}}
}

func pod(name, job string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID("uid-" + name),
		Annotations: map[string]string{k8s.WorkloadAnnotation: job}}}
}

// cluster is the scheduler's cache (the real one: assumed pods, snapshot)
// and a framework with the plugin's Filter, Score and Reserve, on a fake
// clientset.
type cluster struct {
	t     *testing.T
	ctx   context.Context
	cache cache.Cache
	snap  *cache.Snapshot
	fw    framework.Framework
	pl    *Plugin
}

func newCluster(t *testing.T, args string, nodes ...*corev1.Node) *cluster {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &cluster{t: t, ctx: ctx, cache: cache.New(ctx, nil, false, false), snap: cache.NewEmptySnapshot()}
	for _, n := range nodes {
		c.cache.AddNode(klog.Background(), n)
	}
	cs := fake.NewClientset()
	var cfg runtime.Object
	if args != "" {
		cfg = &runtime.Unknown{Raw: []byte(args)}
	}
	factory := func(ctx context.Context, _ runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
		p, err := New(ctx, cfg, h)
		if err == nil {
			c.pl = p.(*Plugin)
		}
		return p, err
	}
	fw, err := tf.NewFramework(ctx, []tf.RegisterPluginFunc{
		tf.RegisterQueueSortPlugin(queuesort.Name, queuesort.New),
		tf.RegisterBindPlugin(defaultbinder.Name, defaultbinder.New),
		tf.RegisterFilterPlugin(Name, factory),
		tf.RegisterScorePlugin(Name, factory, 1),
		tf.RegisterReservePlugin(Name, factory),
	}, "memplan",
		frameworkruntime.WithClientSet(cs),
		frameworkruntime.WithInformerFactory(informers.NewSharedInformerFactory(cs, 0)),
		frameworkruntime.WithSnapshotSharedLister(c.snap))
	if err != nil {
		t.Fatal(err)
	}
	c.fw = fw
	return c
}

// schedule runs one scheduling cycle's Filter, Score and Reserve for p
// over every node, as the scheduler's schedulePod does: the node with the
// highest total score among those Filter passes (ties by name), the pod
// assumed there. It returns the node, or "" and each node's status.
func (c *cluster) schedule(p *corev1.Pod) (string, map[string]*fwk.Status) {
	c.t.Helper()
	if err := c.cache.UpdateSnapshot(klog.Background(), c.snap); err != nil {
		c.t.Fatal(err)
	}
	infos, err := c.snap.NodeInfos().List()
	if err != nil {
		c.t.Fatal(err)
	}
	state := framework.NewCycleState()
	var feasible []fwk.NodeInfo
	failed := map[string]*fwk.Status{}
	for _, ni := range infos {
		st := c.fw.RunFilterPlugins(c.ctx, state, p, ni)
		if st.IsSuccess() {
			feasible = append(feasible, ni)
		} else {
			failed[ni.Node().Name] = st
		}
	}
	if len(feasible) == 0 {
		return "", failed
	}
	scores, st := c.fw.RunScorePlugins(c.ctx, state, p, feasible)
	if !st.IsSuccess() {
		c.t.Fatalf("score %s: %v", p.Name, st.AsError())
	}
	slices.SortStableFunc(scores, func(a, b fwk.NodePluginScores) int {
		if a.TotalScore != b.TotalScore {
			return int(b.TotalScore - a.TotalScore)
		}
		return strings.Compare(a.Name, b.Name)
	})
	host := scores[0].Name
	assumed := p.DeepCopy()
	assumed.Spec.NodeName = host
	if err := c.cache.AssumePod(klog.Background(), assumed); err != nil {
		c.t.Fatal(err)
	}
	if err := c.cache.UpdateSnapshot(klog.Background(), c.snap); err != nil {
		c.t.Fatal(err)
	}
	if st := c.fw.RunReservePluginsReserve(c.ctx, state, assumed, host); !st.IsSuccess() {
		c.t.Fatalf("reserve %s on %s: %v", p.Name, host, st.AsError())
	}
	return host, nil
}

// envelopes of the jobs on an H100, as pack computes them.
func envelopes(t *testing.T) map[string]*pack.Envelope {
	g, _ := hw.Lookup("h100")
	out := map[string]*pack.Envelope{}
	pl := &k8s.Planner{}
	for name, j := range jobs {
		w, err := k8s.ParseWorkload(j, "ml/"+name, "")
		if err != nil {
			t.Fatal(err)
		}
		if out[name], err = pl.Envelope(w, g); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// The plugin, in the scheduler framework over the scheduler's own cache,
// places a set of pods on three H100s (two nodes) as pack's curve policy
// places them — every pod placed, no GPU holding more than its capacity,
// as many GPUs as pack needs — and refuses the pod that would run a GPU
// out of memory: with it the set needs a fourth GPU under pack's curve
// policy, and the static model_size policy would have admitted it onto a
// GPU that runs out of memory.
func TestPluginPlacesAsPackAndRefusesTheOOM(t *testing.T) {
	c := newCluster(t, "", gpuNode("node-a", 2), gpuNode("node-b", 1))
	envs := envelopes(t)
	order := []string{"xl", "xl", "xl", "llama", "llama", "qwen", "qwen", "ft"}
	var procs []*pack.Envelope
	type slot struct {
		node string
		gpu  int
	}
	held := map[slot]units.Bytes{}
	allocated := map[slot]units.Bytes{}
	for i, j := range order {
		p := pod(fmt.Sprintf("%s-%d", j, i), jobs[j])
		host, failed := c.schedule(p)
		if host == "" {
			t.Fatalf("%s refused: %v", p.Name, failed)
		}
		g, ok := c.pl.Reserved(p.UID)
		if !ok {
			t.Fatalf("%s: no GPU reserved", p.Name)
		}
		held[slot{host, g}] += envs[j].Cap
		allocated[slot{host, g}] += envs[j].Allocated
		e := *envs[j]
		e.Job = p.Name
		procs = append(procs, &e)
	}
	h100, _ := hw.Lookup("h100")
	for s, b := range held {
		if b > h100.Capacity() || allocated[s] > h100.Capacity() {
			t.Errorf("%v holds %s (allocated %s) > %s", s, b, allocated[s], h100.Capacity())
		}
	}
	res, err := pack.PackEnvelopes(procs, pack.Pool{GPU: h100, Count: 3}, pack.Options{Policies: []pack.Policy{pack.Curve}})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != res.Policies[0].GPUsNeeded || len(res.Policies[0].Unplaced) != 0 {
		t.Errorf("plugin used %d GPUs, pack %d (unplaced %v)", len(held), res.Policies[0].GPUsNeeded, res.Policies[0].Unplaced)
	}
	t.Logf("plugin: %v; pack needs %d GPUs", held, res.Policies[0].GPUsNeeded)

	// One more gpt2-xl fine-tune: no GPU has 36.12 GiB left.
	extra := pod("xl-extra", jobs["xl"])
	host, failed := c.schedule(extra)
	if host != "" {
		t.Fatalf("the pod that would OOM was placed on %s", host)
	}
	for n, st := range failed {
		if st.Code() != fwk.Unschedulable || !strings.Contains(st.Message(), "needs 36.12 GiB on one GPU") {
			t.Errorf("%s: %v %q", n, st.Code(), st.Message())
		}
	}
	e := *envs["xl"]
	e.Job = extra.Name
	res, _ = pack.PackEnvelopes(append(procs, &e), pack.Pool{GPU: h100, Count: 3}, pack.Options{Policies: []pack.Policy{pack.Curve, pack.Static}})
	// pack, placing the nine largest first, needs a fourth GPU too (it
	// leaves other, smaller pods out: what does not fit is the set).
	if r := res.Policies[0]; r.GPUsNeeded != 4 || len(r.Unplaced) == 0 {
		t.Errorf("pack curve: %d GPUs needed, unplaced %v; want 4", r.GPUsNeeded, r.Unplaced)
	}
	if st := res.Policies[1]; len(st.Unplaced) != 0 || st.OOMGPUs == 0 {
		t.Errorf("static model_size should place it and run a GPU out of memory: %+v", st)
	}
}

// A pod whose annotation does not parse is an error of that pod (the
// framework's Error status), never a crash, and the next pod schedules.
func TestPluginBadAnnotation(t *testing.T) {
	c := newCluster(t, "", gpuNode("node-a", 1), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-1"}})
	for bad, want := range map[string]string{
		"train: {model: gpt2, micro-batch: four}": "pod ml/bad: annotation memplan.io/workload: ",
		"[":                             "not YAML or JSON",
		"train: {model: no-such-model}": "no-such-model",
		"{}":                            "give exactly one of train, serve",
	} {
		host, failed := c.schedule(pod("bad", bad))
		if host != "" {
			t.Fatalf("%q placed", bad)
		}
		st := failed["node-a"]
		if st.Code() != fwk.Error || !strings.Contains(st.Message(), want) {
			t.Errorf("%q: %v %q, want %q", bad, st.Code(), st.Message(), want)
		}
	}
	host, failed := c.schedule(pod("good", jobs["ft"]))
	if host != "node-a" {
		t.Fatalf("good pod: %q %v", host, failed)
	}
	// A pod without the annotation passes every node.
	plain := pod("plain", "")
	delete(plain.Annotations, k8s.WorkloadAnnotation)
	if _, failed := c.schedule(plain); len(failed) != 0 {
		t.Errorf("plain pod refused: %v", failed)
	}
	// A CPU node is unresolvable for a GPU pod.
	_, failed = c.schedule(pod("big", "train: {model: llama-2-13b, micro-batch: 8, seq: 4096, precision: amp-bf16}"))
	if failed["cpu-1"].Code() != fwk.UnschedulableAndUnresolvable || failed["node-a"].Code() != fwk.UnschedulableAndUnresolvable {
		t.Errorf("%v", failed)
	}
}

// A scheduling cycle the scheduler abandons (its context done) stops the
// planning of a workload not planned yet and is the pod's error, never a
// verdict on the node; the next cycle plans it and places the pod.
func TestPluginCycleCancelled(t *testing.T) {
	c := newCluster(t, "", gpuNode("node-a", 1))
	if err := c.cache.UpdateSnapshot(klog.Background(), c.snap); err != nil {
		t.Fatal(err)
	}
	infos, err := c.snap.NodeInfos().List()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := pod("ft", jobs["ft"])
	st := c.fw.RunFilterPlugins(ctx, framework.NewCycleState(), p, infos[0])
	if st.Code() != fwk.Error || !strings.Contains(st.Message(), "context canceled") {
		t.Fatalf("filter in a cancelled cycle: %v %q, want the cycle's error", st.Code(), st.Message())
	}
	if host, failed := c.schedule(p); host != "node-a" {
		t.Fatalf("the next cycle: %q %v", host, failed)
	}
}

func TestPluginArgs(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{`{"policy": "static"}`, "want curve or peaks"},
		{`{"margin": "lots"}`, "margin"},
		{`{"colour": 1}`, `MemplanGPU args: unknown key "colour"`},
		{`{"policy": 3}`, "MemplanGPU args: policy: want a string, got a number"},
		{`[`, "MemplanGPU args: truncated JSON"},
	} {
		_, err := New(context.Background(), &runtime.Unknown{Raw: []byte(c.args)}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.args, err)
		}
	}
	if _, err := New(context.Background(), &runtime.Unknown{Raw: []byte(`{"policy": "peaks", "margin": "1GiB"}`)}, nil); err != nil {
		t.Error(err)
	}
	// Zero in any spelling, as "0" (units.ParseBytesOrZero).
	for _, m := range []string{"0", "0B", "0GiB", "0.0GiB"} {
		if pl, err := New(context.Background(), &runtime.Unknown{Raw: []byte(`{"margin": "` + m + `"}`)}, nil); err != nil || pl.(*Plugin).planner.Margin != 0 {
			t.Errorf("margin %s: %v", m, err)
		}
	}
}

// The scheduler's cache reports to the scheduler's metrics, which the
// scheduler registers at start.
func TestMain(m *testing.M) {
	metrics.Register()
	os.Exit(m.Run())
}
