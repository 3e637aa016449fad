package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/internal/msgcheck"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/units"
)

// The ExtenderArgs in testdata are what kube-scheduler's HTTPExtender
// sends with nodeCacheCapable: false (the pod and a NodeList), written
// for this test by the script in testdata/README.md: nodes labelled as GPU
// feature discovery labels them, pods.json as kubectl get pods -A -o json
// lists them.
func readArgs(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testExtender(t *testing.T, p pack.Policy) *Extender {
	t.Helper()
	pods, err := ReadPodFile("testdata/pods.json")
	if err != nil {
		t.Fatal(err)
	}
	return &Extender{Planner: &Planner{Policy: p}, Pods: pods}
}

func post(t *testing.T, srv *httptest.Server, verb string, body []byte) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(srv.URL+"/"+verb, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp, buf.Bytes()
}

// envelope of a job on an H100, as pack computes it.
func envelope(t *testing.T, w string) *pack.Envelope {
	t.Helper()
	wl, err := ParseWorkload(w, "t/x", "")
	if err != nil {
		t.Fatal(err)
	}
	g, _ := hw.Lookup("h100")
	e, err := (&Planner{}).Envelope(wl, g)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

const xl = "train: {model: gpt2-xl, micro-batch: 4, seq: 1024, precision: amp-bf16, checkpoint: full}"

func TestExtenderFilterRecorded(t *testing.T) {
	srv := httptest.NewServer(testExtender(t, pack.Curve).Handler())
	defer srv.Close()
	resp, body := post(t, srv, "filter", readArgs(t, "args-xl.json"))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	if res.Error != "" {
		t.Fatalf("error %q", res.Error)
	}
	if got := strings.Join(*res.NodeNames, ","); got != "gpu-a,gpu-c" {
		t.Errorf("nodes %s, want gpu-a,gpu-c", got)
	}
	if len(res.Nodes.Items) != 2 {
		t.Errorf("%d nodes in Nodes", len(res.Nodes.Items))
	}
	// gpu-b's one H100 holds two gpt2-xl fine-tunes (36.12 GiB each under
	// curve, autocast's weight-cast cache held to the end of each
	// checkpointed forward included): 6.94 GiB left, a third needs 36.12 —
	// room preemption could make, so FailedNodes.
	if r := res.FailedNodes["gpu-b"]; !strings.Contains(r, "needs 36.12 GiB") {
		t.Errorf("gpu-b: %q", r)
	}
	for n, want := range map[string]string{"cpu-1": "no nvidia.com/gpu.product label", "gpu-mig": "MIG device"} {
		if r := res.FailedAndUnresolvableNodes[n]; !strings.Contains(r, want) {
			t.Errorf("%s: %q, want %q", n, r, want)
		}
	}
	for _, r := range res.FailedNodes {
		checkMsg(t, r)
	}
	for _, r := range res.FailedAndUnresolvableNodes {
		checkMsg(t, r)
	}
}

// The same node that curve refuses, the static model_size policy admits:
// it counts 2.90 GiB for the gpt2-xl fine-tune, and the three processes'
// allocated peaks then exceed the H100 — the OOM the extender prevents.
func TestExtenderStaticWouldOOM(t *testing.T) {
	var args extenderv1.ExtenderArgs
	if err := json.Unmarshal(readArgs(t, "args-xl.json"), &args); err != nil {
		t.Fatal(err)
	}
	res := testExtender(t, pack.Static).Filter(context.Background(), &args)
	if _, failed := res.FailedNodes["gpu-b"]; failed || res.Error != "" {
		t.Fatalf("static refused gpu-b: %+v", res)
	}
	e := envelope(t, xl)
	g, _ := hw.Lookup("h100")
	if 3*e.Allocated <= g.Capacity() {
		t.Fatalf("three gpt2-xl allocated peaks %s fit %s: the scenario shows nothing", 3*e.Allocated, g.Capacity())
	}
	if e.ModelSize*3 > g.Capacity() {
		t.Fatal("static should count less than a GPU")
	}
}

func TestExtenderPrioritizeTightest(t *testing.T) {
	srv := httptest.NewServer(testExtender(t, pack.Curve).Handler())
	defer srv.Close()
	resp, body := post(t, srv, "prioritize", readArgs(t, "args-xl.json"))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var list extenderv1.HostPriorityList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	score := map[string]int64{}
	for _, h := range list {
		score[h.Host] = h.Score
	}
	// gpu-a's free GPU holds a Qwen service (19.27 GiB), gpu-c's a Llama 3
	// 8B service (25.68 GiB): beside the 36.12 GiB job gpu-c is fuller.
	e, q, l := envelope(t, xl), envelope(t, "serve: {model: qwen2.5-7b, concurrency: 64, context: 1024, gen-tokens: 256}"), envelope(t, "serve: {model: llama-3-8b, concurrency: 32, context: 2048, gen-tokens: 512}")
	g, _ := hw.Lookup("h100")
	want := func(u units.Bytes) int64 {
		return Placement{Fits: true, Used: u, Room: g.Capacity()}.Score(extenderv1.MaxExtenderPriority)
	}
	if score["gpu-a"] != want(e.Cap+q.Cap) || score["gpu-c"] != want(e.Cap+l.Cap) || score["gpu-c"] <= score["gpu-a"] {
		t.Errorf("scores %v: want gpu-a %d < gpu-c %d", score, want(e.Cap+q.Cap), want(e.Cap+l.Cap))
	}
	for _, n := range []string{"gpu-b", "cpu-1", "gpu-mig"} {
		if score[n] != 0 {
			t.Errorf("%s scored %d", n, score[n])
		}
	}
}

func TestExtenderPodWithoutAnnotation(t *testing.T) {
	var args extenderv1.ExtenderArgs
	json.Unmarshal(readArgs(t, "args-plain.json"), &args)
	res := testExtender(t, pack.Curve).Filter(context.Background(), &args)
	if res.Error != "" || len(*res.NodeNames) != 5 {
		t.Fatalf("a pod without the annotation should pass every node: %+v", res)
	}
}

// Errors are the pod's, not the nodes': Error set, no node failed.
func TestExtenderErrors(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"args-bad.json", "annotation memplan.io/workload"},
		{"args-big.json", ""},
	} {
		var args extenderv1.ExtenderArgs
		json.Unmarshal(readArgs(t, c.file), &args)
		res := testExtender(t, pack.Curve).Filter(context.Background(), &args)
		if c.want == "" {
			// llama-2-13b full fine-tune needs more than an H100: every
			// H100 node is unresolvable, not an error.
			if res.Error != "" || len(*res.NodeNames) != 0 || !strings.Contains(res.FailedAndUnresolvableNodes["gpu-a"], "more than a whole h100") {
				t.Errorf("%s: %+v", c.file, res)
			}
			continue
		}
		if !strings.Contains(res.Error, c.want) || len(res.FailedNodes) != 0 {
			t.Errorf("%s: error %q, want %q", c.file, res.Error, c.want)
		}
		checkMsg(t, res.Error)
	}
}

// A request the extender cannot read is 400 (413 past the size limit)
// with one line naming the JSON field, never a Go type, and data after the
// JSON object is refused. /prioritize answers a request it cannot judge
// (the pod's annotation) with 400 too: kube-scheduler takes any status but
// 200 as a failed call.
func TestExtenderBadRequests(t *testing.T) {
	srv := httptest.NewServer(testExtender(t, pack.Curve).Handler())
	defer srv.Close()
	bad := string(readArgs(t, "args-bad.json"))
	for _, c := range []struct {
		verb, body string
		status     int
		want       string
	}{
		{"filter", "", 400, "the request body is empty"},
		{"filter", "{", 400, "the request body is not valid JSON (it ends early)"},
		{"filter", `{"Pod": }`, 400, "the request body is not valid JSON (at byte 9: "},
		{"filter", `{"Nodes": {"items": []}}`, 400, `the request has no "Pod"`},
		{"filter", `{"Pod": 5}`, 400, `field "Pod" must be an object, not a number`},
		{"filter", `[]`, 400, `the request body must be a JSON object with "Pod" and "Nodes", not an array`},
		{"filter", `{"Pod": {"metadata": {"name": 5}}}`, 400, `field "Pod.metadata.name" must be a string, not a number`},
		{"filter", `{"Pod": {}, "Nodes": {"items": []}} garbage`, 400, "the request body has data after its JSON object"},
		{"filter", `{"Pod": {}, "Nodes": {"items": []}} {}`, 400, "the request body has data after its JSON object"},
		{"prioritize", `[1,2]`, 400, "must be a JSON object"},
		{"prioritize", `{"Pod": {}, "Nodes": {"items": []}} x`, 400, "data after its JSON object"},
		{"prioritize", bad, 400, "annotation memplan.io/workload"},
		{"filter", `{"Pod": {"metadata": {"name": "` + strings.Repeat("x", maxArgs) + `"}}}`, 413, "over the limit of"},
	} {
		resp, body := post(t, srv, c.verb, []byte(c.body))
		var e struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != c.status || !strings.Contains(e.Error, c.want) || strings.Contains(e.Error, "\n") {
			t.Errorf("%s %.60q: %d %.300s, want %d with one line containing %q", c.verb, c.body, resp.StatusCode, body, c.status, c.want)
		}
		for _, leak := range []string{"Go ", "v1.", "ExtenderArgs.", "json: ", "unmarshal"} {
			if strings.Contains(e.Error, leak) {
				t.Errorf("%s %.60q: %q says %q", c.verb, c.body, e.Error, leak)
			}
		}
		checkMsg(t, e.Error)
	}
	// NodeNames only (a node-cache-capable configuration): an Error.
	x := testExtender(t, pack.Curve)
	var args extenderv1.ExtenderArgs
	json.Unmarshal(readArgs(t, "args-xl.json"), &args)
	args.Nodes = nil
	if res := x.Filter(context.Background(), &args); !strings.Contains(res.Error, "nodeCacheCapable: false") {
		t.Errorf("NodeNames only: %+v", res)
	}
}

// The extender reads only bodies sent as application/json, as
// kube-scheduler sends them: a page of another site may POST text/plain or
// a form to it without a preflight, and a plain-text body was read as
// ExtenderArgs, so any page a cluster user opened could make the extender
// plan. Both verbs answer 415 with one line.
func TestExtenderContentType(t *testing.T) {
	srv := httptest.NewServer(testExtender(t, pack.Curve).Handler())
	defer srv.Close()
	body := readArgs(t, "args-xl.json")
	for _, c := range []struct {
		ctype  string
		status int
	}{
		{"application/json", 200},
		{"application/json; charset=utf-8", 200},
		{"text/plain", 415},
		{"text/plain; charset=utf-8", 415},
		{"application/x-www-form-urlencoded", 415},
		{"", 415},
		{"application/json; charset=utf-16", 415},
	} {
		for _, verb := range []string{"filter", "prioritize"} {
			req, err := http.NewRequest("POST", srv.URL+"/"+verb, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var e struct {
				Error string `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Errorf("%s as %q: %d, want %d", verb, c.ctype, resp.StatusCode, c.status)
			}
			if c.status == 415 && (!strings.Contains(e.Error, "Content-Type: application/json") || strings.Contains(e.Error, "\n")) {
				t.Errorf("%s as %q: %q, want one line naming the Content-Type", verb, c.ctype, e.Error)
			}
		}
	}
}

// A pod source that fails is the pod's error.
type failing struct{}

func (failing) Pods(context.Context) ([]*corev1.Pod, error) {
	return nil, errors.New("connection refused")
}

func TestExtenderPodSourceFails(t *testing.T) {
	var args extenderv1.ExtenderArgs
	json.Unmarshal(readArgs(t, "args-xl.json"), &args)
	x := &Extender{Planner: &Planner{Policy: pack.Curve}, Pods: failing{}}
	if res := x.Filter(context.Background(), &args); !strings.Contains(res.Error, "listing the pods bound to nodes: connection refused") {
		t.Errorf("%+v", res)
	}
}

// The API server source: the request it makes and a PodList answer.
func TestAPIServerPods(t *testing.T) {
	data := readArgs(t, "pods.json")
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/pods" || r.Header.Get("Authorization") != "Bearer tok" || !strings.Contains(r.URL.Query().Get("fieldSelector"), "spec.nodeName!=") {
			http.Error(w, `{"kind":"Status","message":"forbidden"}`, http.StatusForbidden)
			return
		}
		w.Write(data)
	}))
	defer api.Close()
	pods, err := (&APIServer{Base: api.URL, Token: "tok"}).Pods(context.Background())
	if err != nil || len(pods) != 7 {
		t.Fatalf("%d pods, %v", len(pods), err)
	}
	_, err = (&APIServer{Base: api.URL, Token: "other"}).Pods(context.Background())
	if err == nil || !strings.Contains(err.Error(), "403 Forbidden") {
		t.Errorf("%v", err)
	}
}

func checkMsg(t *testing.T, msg string) {
	t.Helper()
	if p := msgcheck.Problems(msg); len(p) > 0 {
		t.Errorf("%q: %v", msg, p)
	}
}

// withWorkload is the ExtenderArgs of args-xl.json with the pod's
// annotation set to w.
func withWorkload(t *testing.T, w string) *extenderv1.ExtenderArgs {
	t.Helper()
	var args extenderv1.ExtenderArgs
	if err := json.Unmarshal(readArgs(t, "args-xl.json"), &args); err != nil {
		t.Fatal(err)
	}
	args.Pod.Annotations[WorkloadAnnotation] = w
	return &args
}

// A workload that takes longer to plan than the extender's time limit is
// the pod's Error at the limit (prioritize's 503), and the planning stops:
// deepseek-v3 at seq 4096 planned on for 9 s past a 2 s limit and the
// answer came after the server had dropped the connection.
func TestExtenderTimeLimit(t *testing.T) {
	x := testExtender(t, pack.Curve)
	x.Timeout = 100 * time.Millisecond
	args := withWorkload(t, "{train: {model: deepseek-v3, seq: 4096}}")
	start := time.Now()
	res := x.Filter(context.Background(), args)
	answered := time.Since(start)
	if !strings.Contains(res.Error, "time limit of 100ms") || len(res.FailedNodes)+len(res.FailedAndUnresolvableNodes) != 0 {
		t.Fatalf("%+v, want the pod's Error naming the time limit", res)
	}
	checkMsg(t, res.Error)
	if answered > 2*time.Second {
		t.Errorf("a 100ms limit answered after %s", answered)
	}
	x.Planner.mu.Lock()
	left := len(x.Planner.cache)
	x.Planner.mu.Unlock()
	if left != 0 {
		t.Errorf("%d envelopes kept after the only request for them stopped", left)
	}
	srv := httptest.NewServer(x.Handler())
	defer srv.Close()
	body, _ := json.Marshal(args)
	if resp, b := post(t, srv, "prioritize", body); resp.StatusCode != 503 || !strings.Contains(string(b), "time limit of 100ms") {
		t.Errorf("prioritize: %d %s, want 503 naming the time limit", resp.StatusCode, b)
	}
	t.Logf("answered after %s", answered)
}

// One computation serves every request that waits for it, and stops only
// when the last has gone: a request that leaves early does not stop the
// envelope another still waits for; when the last leaves, the computation
// stops and the next request computes it afresh.
func TestEnvelopeSharedAndStopped(t *testing.T) {
	p := &Planner{}
	w, err := ParseWorkload("train: {model: deepseek-v3, seq: 4096}", "t/x", "")
	if err != nil {
		t.Fatal(err)
	}
	g, _ := hw.Lookup("h100")
	entry := func() (*entry, int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.cache {
			return e, e.waiters
		}
		return nil, 0
	}
	wait := func(ctx context.Context, n int) chan error {
		out := make(chan error, 1)
		go func() {
			_, err := p.EnvelopeContext(ctx, w, g)
			out <- err
		}()
		for _, k := entry(); k < n; _, k = entry() {
			time.Sleep(time.Millisecond)
		}
		return out
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	first, second := wait(ctx1, 1), wait(ctx2, 2)
	e, _ := entry()
	cancel1()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("the request that left: %v", err)
	}
	if now, k := entry(); now != e || k != 1 || isClosed(e.done) {
		t.Fatalf("after one of two requests left: entry kept %v, %d waiting, done %v", now == e, k, isClosed(e.done))
	}
	cancel2()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Errorf("the last request: %v", err)
	}
	select {
	case <-e.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the computation ran on 5 s after its last request left")
	}
	if now, _ := entry(); now != nil {
		t.Error("a stopped computation is still cached")
	}
	w2, _ := ParseWorkload("train: {model: gpt2, seq: 512}", "t/y", "")
	ctx3, cancel3 := context.WithCancel(context.Background())
	cancel3()
	if _, err := p.EnvelopeContext(ctx3, w2, g); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled request: %v", err)
	}
	if _, err := p.EnvelopeContext(context.Background(), w2, g); err != nil {
		t.Errorf("asked again after a stop: %v", err)
	}
}
