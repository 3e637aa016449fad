package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// PodSource lists the pods bound to nodes (ExtenderArgs carries the pod to
// place and the nodes, not what already runs on them).
type PodSource interface {
	Pods(ctx context.Context) ([]*corev1.Pod, error)
}

// Extender serves the kube-scheduler extender protocol: POST /filter and
// POST /prioritize with ExtenderArgs (nodeCacheCapable: false, so Nodes
// carries every node's labels).
type Extender struct {
	Planner *Planner
	Pods    PodSource
	// Timeout bounds one request (planning a new workload included).
	Timeout time.Duration
}

// maxArgs bounds a request body: ExtenderArgs with a NodeList of a few
// thousand nodes.
const maxArgs = 64 << 20

// Handler routes /filter, /prioritize and /healthz.
func (x *Extender) Handler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("POST /filter", func(w http.ResponseWriter, r *http.Request) {
		args, err := x.read(w, r)
		if err != nil {
			return
		}
		writeJSON(w, http.StatusOK, x.Filter(r.Context(), args))
	})
	m.HandleFunc("POST /prioritize", func(w http.ResponseWriter, r *http.Request) {
		args, err := x.read(w, r)
		if err != nil {
			return
		}
		list, err := x.Prioritize(r.Context(), args)
		if err != nil {
			// The prioritize verb has no error field: a failed call is
			// a non-200 answer, which the scheduler reports (and ignores
			// when the extender is ignorable).
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, list)
	})
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	return m
}

func (x *Extender) read(w http.ResponseWriter, r *http.Request) (*extenderv1.ExtenderArgs, error) {
	var args extenderv1.ExtenderArgs
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxArgs))
	err := dec.Decode(&args)
	if err == nil && args.Pod == nil {
		err = errors.New("no Pod")
	}
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "ExtenderArgs: " + oneLine(err.Error())})
		return nil, err
	}
	return &args, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// judged is each node's verdict for the pod of args.
func (x *Extender) judged(ctx context.Context, args *extenderv1.ExtenderArgs) (*Workload, []corev1.Node, []Verdict, error) {
	if args.Nodes == nil {
		return nil, nil, nil, errors.New("ExtenderArgs has no Nodes: configure the extender with nodeCacheCapable: false")
	}
	w, err := x.Planner.WorkloadOf(args.Pod)
	if err != nil || w == nil {
		return w, args.Nodes.Items, nil, err
	}
	if x.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, x.Timeout)
		defer cancel()
	}
	var pods []*corev1.Pod
	if x.Pods != nil {
		if pods, err = x.Pods.Pods(ctx); err != nil {
			return nil, nil, nil, fmt.Errorf("listing the pods bound to nodes: %w", err)
		}
	}
	out := make([]Verdict, len(args.Nodes.Items))
	for i := range args.Nodes.Items {
		if err := ctx.Err(); err != nil {
			return nil, nil, nil, err
		}
		if out[i], err = x.Planner.Judge(w, &args.Nodes.Items[i], pods); err != nil {
			return nil, nil, nil, err
		}
	}
	return w, args.Nodes.Items, out, nil
}

// Filter keeps the nodes whose GPUs hold the pod's envelope beside what
// runs there. A node that lacks room is in FailedNodes (preempting pods
// may make room); one without GPUs memplan knows, or whose pods cannot be
// read, in FailedAndUnresolvableNodes. A pod whose annotation does not
// parse or whose workload cannot be planned is an Error: the scheduler
// fails that pod's attempt, not the nodes. A pod without the annotation
// passes every node.
func (x *Extender) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	w, nodes, verdicts, err := x.judged(ctx, args)
	if err != nil {
		return &extenderv1.ExtenderFilterResult{Error: err.Error()}
	}
	res := &extenderv1.ExtenderFilterResult{Nodes: &corev1.NodeList{}, FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}}
	var names []string
	for i := range nodes {
		if w != nil && !verdicts[i].Fits {
			if verdicts[i].Unresolvable {
				res.FailedAndUnresolvableNodes[nodes[i].Name] = verdicts[i].Reason
			} else {
				res.FailedNodes[nodes[i].Name] = verdicts[i].Reason
			}
			continue
		}
		res.Nodes.Items = append(res.Nodes.Items, nodes[i])
		names = append(names, nodes[i].Name)
	}
	res.NodeNames = &names
	return res
}

// Prioritize scores each node from 0 to MaxExtenderPriority by how full
// the GPU the pod lands on is then (the tightest fit highest); a node it
// does not fit scores 0, and so does every node for a pod without the
// annotation.
func (x *Extender) Prioritize(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	w, nodes, verdicts, err := x.judged(ctx, args)
	if err != nil {
		return nil, err
	}
	out := make(extenderv1.HostPriorityList, len(nodes))
	for i := range nodes {
		out[i].Host = nodes[i].Name
		if w != nil {
			out[i].Score = verdicts[i].Score(extenderv1.MaxExtenderPriority)
		}
	}
	return out, nil
}
