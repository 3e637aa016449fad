package k8s

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/units"
)

// Planner turns workloads into envelopes on a GPU (cached: planning a job
// takes from milliseconds to seconds) and judges nodes.
type Planner struct {
	// Policy is pack.Peaks or pack.Curve.
	Policy pack.Policy
	// Margin is kept free on every GPU.
	Margin units.Bytes
	// Refs is the directory plan: and snapshot: references are read from.
	Refs string
	// Pinned, when set, gives the GPU a pod holds before its annotation
	// memplan.io/gpu is read (the scheduler plugin's reservations).
	Pinned func(*corev1.Pod) (int, bool)

	mu    sync.Mutex
	cache map[string]*entry
}

// entry is a workload's envelope on a GPU, computed once for every request
// that asks while it is computed (its waiters) and cached after.
type entry struct {
	done    chan struct{} // closed once env or err is set
	env     *pack.Envelope
	err     error
	waiters int
	cancel  context.CancelCauseFunc
}

// maxCache bounds the envelopes kept; past it the cache starts over.
const maxCache = 4096

// Envelope is w's envelope on GPU g.
func (p *Planner) Envelope(w *Workload, g *hw.GPU) (*pack.Envelope, error) {
	return p.EnvelopeContext(context.Background(), w, g)
}

// EnvelopeContext is w's envelope on GPU g, or ctx's cause as soon as ctx
// is done. The envelope is computed once, beside its callers, for all who
// ask while it is computed; it stops (pack.EnvelopesContext) when the last
// of them has gone, and is computed afresh for the next, so a request's
// time limit or its client going away stops the work it alone wanted
// (deepseek-v3 at seq 4096 planned for 9 s after a 2 s limit, and the
// answer came after the server's write timeout had dropped the
// connection).
func (p *Planner) EnvelopeContext(ctx context.Context, w *Workload, g *hw.GPU) (*pack.Envelope, error) {
	k := g.Name + "\x00" + w.key
	p.mu.Lock()
	if p.cache == nil || len(p.cache) >= maxCache {
		p.cache = map[string]*entry{}
	}
	e, ok := p.cache[k]
	if !ok {
		cctx, cancel := context.WithCancelCause(context.Background())
		e = &entry{done: make(chan struct{}), cancel: cancel}
		p.cache[k] = e
		go e.compute(cctx, *w.Job, g)
	}
	e.waiters++
	p.mu.Unlock()
	select {
	case <-e.done:
	case <-ctx.Done():
	}
	p.mu.Lock()
	e.waiters--
	finished := isClosed(e.done)
	if !finished && e.waiters == 0 {
		e.cancel(context.Cause(ctx))
		if p.cache[k] == e {
			delete(p.cache, k)
		}
	}
	p.mu.Unlock()
	if !finished {
		return nil, context.Cause(ctx)
	}
	if e.err != nil {
		return nil, e.err
	}
	c := *e.env
	c.Job = w.Job.Name
	return &c, nil
}

// compute plans the envelope of job on g (one process: a pod is one rank)
// and closes e.done.
func (e *entry) compute(ctx context.Context, job pack.Job, g *hw.GPU) {
	defer e.cancel(nil) // its context's resources
	defer close(e.done)
	defer func() {
		// It runs beside the request that asked: a bug here is that
		// request's error, not the extender's crash.
		if r := recover(); r != nil {
			e.env, e.err = nil, fmt.Errorf("internal error planning the workload (a bug in memplan): %v", r)
		}
	}()
	envs, _, err := pack.EnvelopesContext(ctx, []pack.Job{job}, pack.Pool{GPU: g, Count: 1})
	if err != nil {
		e.err = err
		return
	}
	e.env = largest(envs)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// largest is the rank of a job that holds the most (its reserved peak):
// a pod is one rank, and a workload of several GPUs (tp, pp, dp) does not
// say which, so a pipeline's pod is judged as its largest stage;
// tensor-parallel and data-parallel ranks are alike.
func largest(envs []*pack.Envelope) *pack.Envelope {
	top := envs[0]
	for _, e := range envs[1:] {
		if e.Peak > top.Peak {
			top = e
		}
	}
	return top
}

// PodName is namespace/name.
func PodName(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// WorkloadOf reads a pod's annotation; nil without one.
func (p *Planner) WorkloadOf(pod *corev1.Pod) (*Workload, error) {
	v, ok := pod.Annotations[WorkloadAnnotation]
	if !ok {
		return nil, nil
	}
	return ParseWorkload(v, PodName(pod), p.Refs)
}

// Verdict of a node for a pod.
type Verdict struct {
	Placement
	// Unresolvable: removing pods would not help (the node has no GPUs
	// memplan knows, or what runs there cannot be read).
	Unresolvable bool
}

// ErrPlan wraps a workload memplan cannot plan (an unknown model, a job
// that does not fit any GPU of its kind): an error for the pod, not a
// property of one node.
var ErrPlan = errors.New("cannot plan the pod's workload")

// Judge decides whether w (of pod) fits node beside pods (those bound to
// it). The error is the pod's (its workload cannot be planned); a node
// that cannot hold it, or whose GPUs or pods cannot be read, is a Verdict.
func (p *Planner) Judge(w *Workload, node *corev1.Node, pods []*corev1.Pod) (Verdict, error) {
	return p.JudgeContext(context.Background(), w, node, pods)
}

// JudgeContext is Judge returning ctx's cause once ctx is done, the
// envelopes it waits for included (EnvelopeContext): the request's error,
// not the node's or the workload's.
func (p *Planner) JudgeContext(ctx context.Context, w *Workload, node *corev1.Node, pods []*corev1.Pod) (Verdict, error) {
	gpus, err := GPUsOf(node)
	if err != nil {
		return Verdict{Placement: Placement{GPU: -1, Reason: err.Error()}, Unresolvable: true}, nil
	}
	env, err := p.EnvelopeContext(ctx, w, gpus.GPU)
	if ctx.Err() != nil {
		return Verdict{}, context.Cause(ctx)
	}
	if err != nil {
		return Verdict{}, fmt.Errorf("%w on %s: %s", ErrPlan, gpus.GPU.Name, oneLine(err.Error()))
	}
	var procs []Proc
	var whole int64
	for _, q := range pods {
		if q.Spec.NodeName != node.Name || q.Status.Phase == corev1.PodSucceeded || q.Status.Phase == corev1.PodFailed {
			continue
		}
		qw, err := p.WorkloadOf(q)
		if err != nil {
			return Verdict{Placement: Placement{GPU: -1, Reason: "a pod running there: " + err.Error()}, Unresolvable: true}, nil
		}
		if qw == nil {
			whole += wholeGPUs(q)
			continue
		}
		qe, err := p.EnvelopeContext(ctx, qw, gpus.GPU)
		if ctx.Err() != nil {
			return Verdict{}, context.Cause(ctx)
		}
		if err != nil {
			return Verdict{Placement: Placement{GPU: -1, Reason: fmt.Sprintf("pod %s running there cannot be planned: %s", PodName(q), oneLine(err.Error()))}, Unresolvable: true}, nil
		}
		g := -1
		if i, ok := p.pinned(q); ok && i < gpus.Count {
			g = i
		} else if s, ok := q.Annotations[GPUAnnotation]; ok {
			if g, err = strconv.Atoi(s); err != nil || g < 0 || g >= gpus.Count {
				return Verdict{Placement: Placement{GPU: -1, Reason: fmt.Sprintf("pod %s: annotation %s=%s is not a GPU index below %d", PodName(q), GPUAnnotation, cut(s), gpus.Count)}, Unresolvable: true}, nil
			}
		}
		procs = append(procs, Proc{Name: PodName(q), Need: qe.Need(p.Policy), GPU: g})
	}
	need := env.Need(p.Policy)
	if need > gpus.GPU.Capacity()-p.Margin {
		return Verdict{Placement: Placement{GPU: -1, Reason: fmt.Sprintf("needs %s, more than a whole %s less the margin", need, gpus.GPU.Name)}, Unresolvable: true}, nil
	}
	pl := Place(gpus.GPU.Capacity(), gpus.Count, whole, p.Margin, procs, need)
	if !pl.Fits {
		pl.Reason = fmt.Sprintf("%s GPUs under the %s policy: %s", gpus.GPU.Name, p.Policy, pl.Reason)
	}
	return Verdict{Placement: pl}, nil
}

func (p *Planner) pinned(q *corev1.Pod) (int, bool) {
	if p.Pinned == nil {
		return -1, false
	}
	return p.Pinned(q)
}
