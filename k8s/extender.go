package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/memplan/memplan/internal/jsonbody"
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
	// Timeout bounds one request, planning a new workload included: at it
	// the filter answers an Error, prioritize 503, and the planning stops
	// unless another request waits for it (Planner.EnvelopeContext).
	Timeout time.Duration
}

// maxArgs bounds a request body: ExtenderArgs with a NodeList of a few
// thousand nodes.
const maxArgs = 64 << 20

// Handler routes /filter, /prioritize and /healthz.
func (x *Extender) Handler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("POST /filter", func(w http.ResponseWriter, r *http.Request) {
		args, ok := x.read(w, r)
		if !ok {
			return
		}
		writeJSON(w, http.StatusOK, x.Filter(r.Context(), args))
	})
	m.HandleFunc("POST /prioritize", func(w http.ResponseWriter, r *http.Request) {
		args, ok := x.read(w, r)
		if !ok {
			return
		}
		list, err := x.Prioritize(r.Context(), args)
		if err != nil {
			// The prioritize verb has no error field: a failed call is a
			// non-200 answer. kube-scheduler takes every status but 200
			// alike (pkg/scheduler/extender.go @ v1.37.2, send), so the
			// status is for people and logs: 4xx for the request's
			// fault, 503 for the extender's.
			writeJSON(w, errorStatus(err), map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, list)
	})
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	return m
}

// timeLimit is the cause of a request's context ending at the extender's
// time limit (Extender.Timeout): the filter's Error, prioritize's 503.
type timeLimit time.Duration

func (t timeLimit) Error() string {
	return fmt.Sprintf("the request ran past the extender's time limit of %s (a workload planned the first time can take longer)", time.Duration(t))
}

// Is makes it a deadline to errors.Is, as the context's own error.
func (timeLimit) Is(target error) bool { return target == context.DeadlineExceeded }

// errListing wraps a failure to list the pods bound to nodes (the API
// server's, not the request's).
var errListing = errors.New("listing the pods bound to nodes")

// errorStatus is the HTTP status of an error judging a request: 503 when
// the extender could not answer (its time limit, the request cancelled, the
// pods not listed), else 400 (the request's nodes, the pod's annotation or
// workload).
func errorStatus(err error) int {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, errListing) {
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

// read decodes the request's ExtenderArgs: one JSON object with a Pod and
// nothing after it, sent as application/json. Otherwise it answers 400
// (413 past maxArgs, 415 for another Content-Type, jsonbody.Check) with one
// line naming the JSON field and returns false.
func (x *Extender) read(w http.ResponseWriter, r *http.Request) (*extenderv1.ExtenderArgs, bool) {
	if err := jsonbody.Check(r.Header); err != nil {
		writeJSON(w, http.StatusUnsupportedMediaType, map[string]string{"error": err.Error()})
		return nil, false
	}
	var args extenderv1.ExtenderArgs
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxArgs))
	err := dec.Decode(&args)
	if err == nil {
		// Decode stops after the object; what follows is refused, not
		// ignored.
		if _, end := dec.Token(); end != io.EOF {
			err = errTrailing
		}
	}
	if err == nil && args.Pod == nil {
		err = errors.New(`the request has no "Pod"`)
	}
	if err != nil {
		status, msg := argsError(err)
		writeJSON(w, status, map[string]string{"error": msg})
		return nil, false
	}
	return &args, true
}

var errTrailing = errors.New("the request body has data after its JSON object")

// argsError words a request body's decoding error in JSON's terms, the
// field by its path (Pod.metadata.name), never the Go type it decodes
// into.
func argsError(err error) (int, string) {
	var mb *http.MaxBytesError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &mb):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over the limit of %d bytes", mb.Limit)
	case errors.Is(err, io.EOF):
		return http.StatusBadRequest, `the request body is empty: want kube-scheduler's ExtenderArgs, a JSON object with "Pod" and "Nodes"`
	case errors.Is(err, io.ErrUnexpectedEOF):
		return http.StatusBadRequest, "the request body is not valid JSON (it ends early)"
	case errors.Is(err, errTrailing):
		return http.StatusBadRequest, err.Error()
	case errors.As(err, &se):
		return http.StatusBadRequest, fmt.Sprintf("the request body is not valid JSON (at byte %d: %s)", se.Offset, se.Error())
	case errors.As(err, &te) && te.Field == "":
		return http.StatusBadRequest, fmt.Sprintf(`the request body must be a JSON object with "Pod" and "Nodes", not %s`, withArticle(te.Value))
	case errors.As(err, &te):
		return http.StatusBadRequest, fmt.Sprintf("field %q must be %s, not %s", te.Field, jsonKind(te.Type), withArticle(te.Value))
	}
	return http.StatusBadRequest, "the request body: " + oneLine(err.Error())
}

// jsonKind is what JSON value decodes into t, in words.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "another JSON value"
}

// withArticle is encoding/json's name of a JSON value ("number", "array")
// with its article.
func withArticle(v string) string {
	switch {
	case v == "":
		return "that value"
	case strings.HasPrefix(v, "number "):
		return "the number " + strings.TrimPrefix(v, "number ")
	case strings.ContainsAny(v[:1], "aeiou"):
		return "an " + v
	}
	return "a " + v
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
	if err := checkNodes(args.Nodes.Items); err != nil {
		return nil, nil, nil, err
	}
	w, err := x.Planner.WorkloadOf(args.Pod)
	if err != nil || w == nil {
		return w, args.Nodes.Items, nil, err
	}
	if x.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, x.Timeout, timeLimit(x.Timeout))
		defer cancel()
	}
	var pods []*corev1.Pod
	if x.Pods != nil {
		if pods, err = x.Pods.Pods(ctx); err != nil {
			if cause := context.Cause(ctx); cause != nil {
				return nil, nil, nil, cause
			}
			return nil, nil, nil, fmt.Errorf("%w: %w", errListing, err)
		}
	}
	out := make([]Verdict, len(args.Nodes.Items))
	for i := range args.Nodes.Items {
		if err := context.Cause(ctx); err != nil {
			return nil, nil, nil, err
		}
		if out[i], err = x.Planner.JudgeContext(ctx, w, &args.Nodes.Items[i], pods); err != nil {
			return nil, nil, nil, err
		}
	}
	return w, args.Nodes.Items, out, nil
}

// checkNodes refuses a request whose nodes are not each named once: the
// scheduler sends every node once, by its name, and the answer names the
// nodes it keeps (NodeNames) and fails (FailedNodes, a map by name). A node
// without a name came back in NodeNames as "", which names no node, and a
// node listed twice came back twice; neither is a request kube-scheduler
// sends, so it is refused (the filter's Error, prioritize's 400) rather
// than answered.
func checkNodes(nodes []corev1.Node) error {
	seen := make(map[string]int, len(nodes))
	for i := range nodes {
		name := nodes[i].Name
		if name == "" {
			return fmt.Errorf("Nodes.items[%d] has no metadata.name: a node without a name cannot be scheduled onto", i)
		}
		if j, ok := seen[name]; ok {
			return fmt.Errorf("Nodes.items[%d] is node %q again (as Nodes.items[%d]): each node is listed once", i, cut(name), j)
		}
		seen[name] = i
	}
	return nil
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
