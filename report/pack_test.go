package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/pack"
)

func packResult(t *testing.T) *pack.Result {
	t.Helper()
	pool, err := pack.ParsePool("2xl4")
	if err != nil {
		t.Fatal(err)
	}
	curve := []pack.Sample{{T: 0.5, Bytes: 3 << 30}, {T: 1, Bytes: 5 << 30}}
	envs := []*pack.Envelope{
		{Job: "a", Context: 1 << 28, Allocated: 5 << 30, Cap: 6 << 30, Peak: 7 << 30, Period: 1, Curve: curve},
		{Job: "b", Context: 1 << 28, Allocated: 5 << 30, Cap: 6 << 30, Peak: 7 << 30, Period: 2, Curve: curve},
	}
	res, err := pack.PackEnvelopes(envs, pool, pack.Options{Policies: []pack.Policy{pack.Peaks, pack.Curve}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// The pack plot is written whole (PNG and SVG) or not at all.
func TestWritePackPlot(t *testing.T) {
	dir := t.TempDir()
	res := packResult(t)
	for _, name := range []string{"pack.png", "pack.svg"} {
		p := filepath.Join(dir, name)
		if err := WritePackPlot(p, res, pack.Curve); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(p); err != nil || st.Size() < 1000 {
			t.Fatalf("%s: %v", p, err)
		}
	}
	for _, tc := range []struct {
		path string
		p    pack.Policy
		want string
	}{
		{"pack.pdf", pack.Curve, `unsupported plot format ".pdf" for a packing`},
		{"pack.gif", pack.Curve, `unsupported plot format ".gif"`},
		{"other.png", pack.Static, "no static assignment to draw"},
	} {
		err := WritePackPlot(filepath.Join(dir, tc.path), res, tc.p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.path, err, tc.want)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 || fileExists(filepath.Join(dir, "other.png")) {
		t.Errorf("left behind: %v", left)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
