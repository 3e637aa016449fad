package k8s

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/memplan/memplan/pack"
)

// podsWithRepeat is testdata/pods.json with the pod at items[i] listed
// again at the end, as the adversarial sweep's pods_dup.json did.
func podsWithRepeat(t *testing.T, i int) []byte {
	t.Helper()
	var list map[string]any
	if err := json.Unmarshal(readArgs(t, "pods.json"), &list); err != nil {
		t.Fatal(err)
	}
	items := list["items"].([]any)
	list["items"] = append(items, items[i])
	b, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A pod listed twice filled its GPU twice: gpu-c failed with "27.82 GiB
// left" for a pod that is there once. A file is refused naming the repeat;
// the API server's list counts the pod once.
func TestPodListedTwice(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.json")
	if err := os.WriteFile(path, podsWithRepeat(t, 5), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadPodFile(path)
	if err == nil || !strings.Contains(err.Error(), "items[7] is items[5] again (pod team-a/chat-2): a pod is listed once") {
		t.Fatalf("a file listing a pod twice: %v", err)
	}
	checkMsg(t, err.Error())

	// The same UID under another name is the same pod.
	var list map[string]any
	json.Unmarshal(podsWithRepeat(t, 5), &list)
	items := list["items"].([]any)
	items[7].(map[string]any)["metadata"] = map[string]any{"name": "renamed", "namespace": "team-a", "uid": "uid-chat-2"}
	b, _ := json.Marshal(list)
	os.WriteFile(path, b, 0o644)
	if _, err := ReadPodFile(path); err == nil || !strings.Contains(err.Error(), "(uid uid-chat-2)") {
		t.Errorf("the same UID twice: %v", err)
	}

	data := podsWithRepeat(t, 5)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(data) }))
	defer api.Close()
	x := &Extender{Planner: &Planner{Policy: pack.Curve}, Pods: &APIServer{Base: api.URL}}
	var args extenderv1.ExtenderArgs
	json.Unmarshal(readArgs(t, "args-xl.json"), &args)
	res := x.Filter(context.Background(), &args)
	if res.Error != "" || strings.Join(*res.NodeNames, ",") != "gpu-a,gpu-c" {
		t.Errorf("the API server's list with a pod twice: %+v, want gpu-a,gpu-c as without", res)
	}
}

// Each node is listed once and by name: a node listed twice came back
// twice in NodeNames, one without a name passed as "". Both are refused,
// the filter's Error and prioritize's 400, naming the node.
func TestExtenderNodesNamedOnce(t *testing.T) {
	srv := httptest.NewServer(testExtender(t, pack.Curve).Handler())
	defer srv.Close()
	for _, c := range []struct {
		name string
		edit func(*extenderv1.ExtenderArgs)
		want string
	}{
		{"twice", func(a *extenderv1.ExtenderArgs) { a.Nodes.Items = append(a.Nodes.Items, a.Nodes.Items[0]) },
			`Nodes.items[5] is node "gpu-a" again (as Nodes.items[0]): each node is listed once`},
		{"no name", func(a *extenderv1.ExtenderArgs) { a.Nodes.Items[0].Name = "" },
			"Nodes.items[0] has no metadata.name: a node without a name cannot be scheduled onto"},
	} {
		for _, file := range []string{"args-xl.json", "args-plain.json"} {
			var args extenderv1.ExtenderArgs
			json.Unmarshal(readArgs(t, file), &args)
			c.edit(&args)
			res := testExtender(t, pack.Curve).Filter(context.Background(), &args)
			if res.Error != c.want || res.NodeNames != nil {
				t.Errorf("%s, %s: %+v, want the Error %q", c.name, file, res, c.want)
			}
			checkMsg(t, res.Error)
			body, _ := json.Marshal(&args)
			resp, out := post(t, srv, "prioritize", body)
			var e struct {
				Error string `json:"error"`
			}
			json.Unmarshal(out, &e)
			if resp.StatusCode != 400 || e.Error != c.want {
				t.Errorf("%s, %s: prioritize %d %s", c.name, file, resp.StatusCode, out)
			}
		}
	}
}

// A node whose nvidia.com/gpu.memory label is no GPU's memory in MiB is
// unresolvable with the label named, as a bad count or product is; it was
// ignored.
func TestExtenderBadMemoryLabel(t *testing.T) {
	for _, v := range []string{"0", "-5", "999999999999", "80GB", ""} {
		var args extenderv1.ExtenderArgs
		json.Unmarshal(readArgs(t, "args-xl.json"), &args)
		args.Nodes.Items[0].Labels[MemoryLabel] = v
		res := testExtender(t, pack.Curve).Filter(context.Background(), &args)
		want := "label nvidia.com/gpu.memory=" + v + " is not a GPU memory in MiB between 1 and "
		if r := res.FailedAndUnresolvableNodes["gpu-a"]; res.Error != "" || !strings.HasPrefix(r, want) {
			t.Errorf("%q: gpu-a %q, want %q", v, r, want)
		}
		if got := strings.Join(*res.NodeNames, ","); got != "gpu-c" {
			t.Errorf("%q: nodes %s, want gpu-c", v, got)
		}
	}
}
