package k8s

import (
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// podWithGPUs is a one-pod PodList whose two containers and init container
// limit nvidia.com/gpu to the given quantities.
func podWithGPUs(a, b, init string) string {
	lim := func(q string) string { return `{"name":"c","resources":{"limits":{"nvidia.com/gpu":"` + q + `"}}}` }
	return `{"kind":"PodList","items":[{"metadata":{"name":"p","namespace":"ns"},"spec":{"containers":[` +
		lim(a) + `,` + lim(b) + `],"initContainers":[` + lim(init) + `]}}]}`
}

// FuzzDecodePods reads --pods files (a PodList, kubectl get pods -o json):
// any input is refused in one line or decodes into pods whose whole-GPU
// count and labels the extender reads without a panic; the whole-GPU count is
// at least each container's limit (two limits of 2^63-1 GPUs summed to -2, counted as 0).
func FuzzDecodePods(f *testing.F) {
	if b, err := os.ReadFile("testdata/pods.json"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		`{}`, `[]`, `null`, `{"kind":"Pod"}`, `{"kind":"PodList","items":[{}]}`, `{"items":[null]}`,
		podWithGPUs("1", "2", "4"),
		podWithGPUs("9223372036854775807", "9223372036854775807", "0"),
		podWithGPUs("1e18", "1e18", "1e18"),
		podWithGPUs("-9223372036854775808", "-1", "0"),
		podWithGPUs("1Ei", "1Ei", "8Ei"),
		podWithGPUs("0.5", "1m", "1n"),
		`{"kind":"PodList","items":[{"metadata":{"labels":{"nvidia.com/gpu.product":"NVIDIA-H100-80GB-HBM3","nvidia.com/gpu.count":"9223372036854775808"}}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pods, err := decodePods(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error in more than one line: %q", err)
			}
			return
		}
		for _, p := range pods {
			n := wholeGPUs(p)
			for _, c := range append(p.Spec.Containers, p.Spec.InitContainers...) {
				if q, ok := c.Resources.Limits[GPUResource]; ok && n < q.Value() {
					t.Fatalf("pod %s: %d whole GPUs, but container %s limits %d", PodName(p), n, c.Name, q.Value())
				}
			}
			// A pod's labels stand in for a node's: GPU feature
			// discovery's labels are outside input too.
			g, err := GPUsOf(&corev1.Node{ObjectMeta: p.ObjectMeta})
			if err != nil {
				if strings.Contains(err.Error(), "\n") {
					t.Fatalf("error in more than one line: %q", err)
				}
				continue
			}
			if g.GPU == nil || g.Count < 1 || g.Count > maxGPUs {
				t.Fatalf("labels %v: %+v", p.Labels, g)
			}
		}
	})
}

// A PodList of the wrong shape is said in the file's words, the key by its
// path, not as the Go type it decodes into ("Go struct field
// PodList.items of type []v1.Pod").
func TestDecodePodsWords(t *testing.T) {
	for in, want := range map[string]string{
		`{"kind": "PodList", "items": "none"}`:                      "not a PodList: items: want a list, got a string",
		`{"kind": "PodList", "items": [{"spec": {"nodeName": 3}}]}`: "not a PodList: items.spec.nodeName: want a string, got a number",
		`[1]`:                            "not a PodList: the document: want a mapping, got a list",
		`{"kind": "PodList", "items": [`: "not a PodList: truncated JSON",
	} {
		_, err := decodePods([]byte(in))
		if err == nil || err.Error() != want {
			t.Errorf("%s: got %v, want %q", in, err, want)
		}
	}
}
