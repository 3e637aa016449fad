package torchtrace

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/units"
)

// Every trace committed under testdata passes the reader's checks (the
// replay invariants: nothing read, saved, viewed or freed when not live).
func TestCommittedTracesValidate(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testdata, "*.trace.json"))
	if err != nil || len(files) < 10 {
		t.Fatalf("found %d traces under %s (%v)", len(files), testdata, err)
	}
	more, _ := filepath.Glob("../../testdata/*/*.trace.json")
	for _, f := range append(files, more...) {
		if _, err := Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// Bad traces derived from three_events.trace.json: each refused in one line
// naming the event index and its op.
func TestValidateReplay(t *testing.T) {
	edit := func(pairs ...string) string {
		s := tiny
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(s, pairs[i]) {
				t.Fatalf("fixture lacks %q", pairs[i])
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		return s
	}
	fwd := `"free": [], "saved": [2]`
	bwd := `"free": [2], "saved": []`
	for _, c := range []struct{ name, in, want string }{
		{"read after free", edit(`"free": [3], "saved": []`, `"free": [3], "saved": [], "inputs": [0, 2]`),
			"events[2].inputs[1] (aten.add_.Tensor): reads storage 2, which was freed after events[1]"},
		{"saved after free", edit(`"free": [3], "saved": []`, `"free": [3], "saved": [2]`),
			"events[2].saved[0] (aten.add_.Tensor): saves storage 2, which was freed after events[1]"},
		{"view of a freed base", edit(`"outputs": [{"storage": 0, "dtype": "float32", "shape": [4, 4], "alias": true`, `"outputs": [{"storage": 2, "dtype": "float32", "shape": [4, 4], "alias": true`),
			"events[2].outputs[0] (aten.add_.Tensor).storage: returns a view of storage 2, which was freed after events[1]"},
		{"freed twice", edit(`"free": [3], "saved": []`, `"free": [3, 2], "saved": []`),
			"events[2].free[1] (aten.add_.Tensor): frees storage 2 twice (it was freed after events[1])"},
		{"freed twice in one event", edit(bwd, `"free": [2, 2], "saved": []`),
			"events[1].free[1] (aten.mm.default): frees storage 2 twice (it was freed after events[1])"},
		{"free of a storage never allocated", edit(bwd, `"free": [2, 7], "saved": []`),
			"events[1].free[1] (aten.mm.default): frees storage 7, which is never allocated (no initial storage or alloc has that id)"},
		{"free before the alloc", edit(fwd, `"free": [3], "saved": [2]`),
			"events[0].free[0] (aten.mm.default): frees storage 3, which is not live"},
		{"read of an id never allocated", edit(fwd, `"free": [], "saved": [2], "inputs": [1, 0, 99]`),
			"events[0].inputs[2] (aten.mm.default): reads storage 99, which is never allocated"},
		{"id out of range", edit(fwd, `"free": [], "saved": [2], "inputs": [1, 2147483648]`),
			"events[0].inputs[1]: storage id 2147483648 out of range"},
		{"negative id", edit(fwd, `"free": [], "saved": [-1]`), "events[0].saved[0]: storage id -1 out of range"},
		{"allocates a live storage", edit(`"id": 3, "bytes": 64`, `"id": 1, "bytes": 64`),
			"events[1].alloc[0] (aten.mm.default): allocates storage 1, which is live"},
		{"v2 without param_grads", edit("memplan.trace/v1", "memplan.trace/v2"), `trace: missing "param_grads"`},
		{"v2 param is a gradient", edit("memplan.trace/v1", "memplan.trace/v2", `"end_live"`, `"param_grads": [{"param": 3, "grad": 3}], "end_live"`),
			"param_grads[0].param: storage 3 is not a parameter"},
		{"v2 grad is an input", edit("memplan.trace/v1", "memplan.trace/v2", `"end_live"`, `"param_grads": [{"param": 0, "grad": 1}], "end_live"`),
			"param_grads[0].grad: storage 1 is not a gradient"},
		{"v2 parameter twice", edit("memplan.trace/v1", "memplan.trace/v2", `"end_live"`, `"param_grads": [{"param": 0, "grad": 3}, {"param": 0, "grad": 3}], "end_live"`),
			"param_grads[1].param: parameter 0 is listed twice"},
		{"v3", edit("memplan.trace/v1", "memplan.trace/v3"), "trace is schema memplan.trace/v3; this memplan reads v1 and v2 — upgrade memplan"},
	} {
		_, err := Parse([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v\nwant %q", c.name, err, c.want)
		}
	}
	v2 := edit("memplan.trace/v1", "memplan.trace/v2", `"end_live"`, `"param_grads": [{"param": 0, "grad": 3}], "end_live"`)
	tr, err := Parse([]byte(v2))
	if err != nil || len(tr.ParamGrads) != 1 || tr.ParamGrads[0] != (ParamGrad{0, 3}) || tr.Schema != SchemaV2 {
		t.Fatalf("v2: %v %+v", err, tr)
	}
}

// Sizes that leave 2^62 bytes when scaled to the replay's batch or
// sequence are refused naming the storage's event and op, never wrapped.
func TestProgramRefusesOverflow(t *testing.T) {
	big := strings.Replace(tiny, `"bytes": 32, "bytes_const": 0, "bytes_per_batch": 16, "dtype": "float32", "shape": [2, 4], "category": "activation"`,
		`"bytes": 2199023255552, "bytes_const": 0, "bytes_per_batch": 1099511627776, "dtype": "float32", "shape": [2, 4], "category": "activation"`, 1)
	tr, err := Parse([]byte(big))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Program(Options{Batch: 1 << 20}); err != nil {
		t.Fatalf("2^60 bytes is under the limit: %v", err)
	}
	for _, c := range []struct {
		batch int
		where string
	}{{1 << 23, "events[0].alloc[0] (aten.mm.default): storage 2"}, {1 << 40, "events[0].alloc[0] (aten.mm.default): storage 2"}, {math.MaxInt, "initial_storages[1]: storage 1"}} {
		_, err := tr.Program(Options{Batch: c.batch})
		want := fmt.Sprintf("%s (float32) is over 4 EiB (2^62 bytes) at batch %d by its size model", c.where, c.batch)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("batch %d: got %v\nwant %s", c.batch, err, want)
		}
	}
	// The inputs built whole (batch × accum) are checked at that batch.
	in := strings.Replace(tiny, `"bytes": 32, "bytes_const": 0, "bytes_per_batch": 16, "dtype": "float32", "shape": [2, 4], "category": "input"`,
		`"bytes": 2199023255552, "bytes_const": 0, "bytes_per_batch": 1099511627776, "dtype": "float32", "shape": [2, 4], "category": "input"`, 1)
	if tr, err = Parse([]byte(in)); err != nil {
		t.Fatal(err)
	}
	_, err = tr.Program(Options{Batch: 1 << 20, Accum: 1 << 10, FullBatchInputs: true})
	if err == nil || !strings.Contains(err.Error(), "initial_storages[1]: storage 1 (float32) is over 4 EiB (2^62 bytes) at batch 1073741824") {
		t.Errorf("whole-batch inputs: got %v", err)
	}
	if _, err = tr.Program(Options{Batch: 1 << 20, Accum: 1 << 10}); err != nil {
		t.Errorf("micro-batch inputs are 2^60 bytes: %v", err)
	}
}

// ComputeDType is what the matmuls wrote, by bytes; without any, the
// parameters' dtype.
func TestComputeDType(t *testing.T) {
	for _, c := range []struct {
		doc  string
		want units.DType
	}{
		{tiny, units.F32},
		{strings.ReplaceAll(tiny, `"float32"`, `"bfloat16"`), units.BF16},
		// no matmul: the parameter's dtype (float16), not the input's
		{strings.ReplaceAll(strings.Replace(tiny, `"dtype": "float32", "shape": [4, 4], "category": "parameter"`, `"dtype": "float16", "shape": [4, 4], "category": "parameter"`, 1), "aten.mm.default", "aten.relu.default"), units.F16},
	} {
		tr, err := Parse([]byte(c.doc))
		if err != nil {
			t.Fatal(err)
		}
		if got := tr.ComputeDType(); got != c.want {
			t.Errorf("got %s, want %s", got, c.want)
		}
		if cp := (Trace{Events: tr.Events, Initial: tr.Initial}); cp.ComputeDType() != c.want {
			t.Errorf("unparsed copy: got %s, want %s", cp.ComputeDType(), c.want)
		}
	}
	lm, err := Load(filepath.Join(testdata, "lm.trace.json"))
	if err != nil || lm.ComputeDType() != units.F32 || lm.ParamDType() != units.F32 {
		t.Errorf("lm: %v", err)
	}
}

// ParamDType is the dtype of the parameters, not of the matmuls: an
// autocast trace's float32 parameters under bfloat16 products.
func TestParamDType(t *testing.T) {
	param := `"dtype": "float32", "shape": [4, 4], "category": "parameter"`
	for _, c := range []struct {
		doc  string
		want units.DType
	}{
		{tiny, units.F32},
		{strings.ReplaceAll(tiny, `"float32"`, `"bfloat16"`), units.BF16},
		{strings.ReplaceAll(strings.Replace(tiny, param, strings.Replace(param, "float32", "float16", 1), 1), "aten.mm.default", "aten.relu.default"), units.F16},
		{strings.Replace(tiny, param, strings.Replace(param, "float32", "int8", 1), 1), units.Invalid},
	} {
		tr, err := Parse([]byte(c.doc))
		if err != nil {
			t.Fatal(err)
		}
		if got := tr.ParamDType(); got != c.want {
			t.Errorf("got %s, want %s", got, c.want)
		}
	}
}
