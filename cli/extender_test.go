package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// memplan extender's flags and --pods file: one line, exit 1, nothing
// served.
func TestExtenderBadInput(t *testing.T) {
	dir := t.TempDir()
	notList := filepath.Join(dir, "pods.json")
	os.WriteFile(notList, []byte(`{"kind": "Pod", "items": []}`), 0o644)
	garbage := filepath.Join(dir, "garbage.json")
	os.WriteFile(garbage, []byte(`{"items": [`), 0o644)
	pods := "../k8s/testdata/pods.json"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"extender", "--pods", pods, "--policy", "static"}, "--policy \"static\": want curve or peaks"},
		{[]string{"extender", "--pods", pods, "--policy", "nope"}, "--policy \"nope\""},
		{[]string{"extender", "--pods", pods, "--margin", "lots"}, "--margin \"lots\""},
		{[]string{"extender", "--pods", pods, "--timeout", "0s"}, "--timeout 0s"},
		{[]string{"extender", "--pods", pods, "--refs", filepath.Join(dir, "none")}, "not a directory"},
		{[]string{"extender", "--pods", filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{"extender", "--pods", notList}, "kind \"Pod\" is not PodList"},
		{[]string{"extender", "--pods", garbage}, "not a PodList"},
		{[]string{"extender", "--pods", pods, "--addr", "256.0.0.1:-1"}, `--addr "256.0.0.1:-1": invalid port -1`},
		{[]string{"extender", "stray"}, "unknown command"},
	} {
		code, out, errs := run(tc.args...)
		if code != 1 || out != "" || !strings.Contains(errs, tc.want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %q", tc.args, code, out, errs, tc.want)
		}
	}
}

// --margin takes zero in any spelling, as its default "0" does.
func TestExtenderMarginZero(t *testing.T) {
	for _, m := range []string{"0", "0B", "0GiB", "0.0GiB"} {
		f := &extenderFlags{policy: "curve", margin: m, timeout: time.Second, pods: "../k8s/testdata/pods.json"}
		x, err := f.extender()
		if err != nil || x.Planner.Margin != 0 {
			t.Errorf("--margin %s: %v", m, err)
		}
	}
}

// Outside a cluster without --pods the extender says what to give.
func TestExtenderNotInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	code, _, errs := run("extender", "--addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errs, "not in a cluster") || !strings.Contains(errs, "--pods FILE") {
		t.Errorf("exit %d: %q", code, errs)
	}
}
