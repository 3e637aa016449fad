package workload

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// oddDir holds odd YAML workloads and expect.json, what each must give:
// {"accept": {field: value, ...}} (a subset of the normalised workload, as
// JSON) or {"refuse": "a fragment of the one-line error"}. This test and
// python/tests/test_workload.py's test_odd_corpus both run it, so the two
// readers agree on every file.
const oddDir = "../testdata/workload/odd"

// oddCase is one expectation.
type oddCase struct {
	Accept map[string]any `json:"accept"`
	Refuse string         `json:"refuse"`
}

func readOdd(t *testing.T) (map[string]oddCase, []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(oddDir, "expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]oddCase
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // 64-bit integers compare exactly
	if err := dec.Decode(&want); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(oddDir, "*.yaml"))
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	for n := range want {
		if !contains(names, n) {
			t.Errorf("expect.json names %s, which is not in %s", n, oddDir)
		}
	}
	sort.Strings(names)
	return want, names
}

// TestOddCorpus: every odd workload is accepted with the expected values or
// refused in one line with the expected fragment.
func TestOddCorpus(t *testing.T) {
	want, names := readOdd(t)
	for _, n := range names {
		c, ok := want[n]
		if !ok {
			t.Errorf("%s: no expectation in expect.json", n)
			continue
		}
		w, err := Load(filepath.Join(oddDir, n))
		checkOdd(t, n, c, w, err)
	}
}

func checkOdd(t *testing.T, name string, c oddCase, w *Workload, err error) {
	t.Helper()
	switch {
	case c.Refuse != "" && err == nil:
		t.Errorf("%s: accepted, want refused with %q", name, c.Refuse)
	case c.Refuse != "":
		if msg := err.Error(); !strings.HasPrefix(msg, name+": ") || !strings.Contains(msg, c.Refuse) || strings.Contains(msg, "\n") {
			t.Errorf("%s:\n got %q\nwant one line naming the file with %q", name, msg, c.Refuse)
		}
	case err != nil:
		t.Errorf("%s: refused (%v), want accepted", name, err)
	default:
		b, _ := json.Marshal(w)
		var got map[string]any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		_ = dec.Decode(&got)
		for k, v := range c.Accept {
			if !reflect.DeepEqual(got[k], v) {
				t.Errorf("%s: %s = %v, want %v", name, k, got[k], v)
			}
		}
	}
}
