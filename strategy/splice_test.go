package strategy

import (
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/ir"
)

// splice and spliceCopy put before[i], op i and after[i] in order for every
// op i, edits in place of the ops they edit and the operand lists of ins on
// theirs, whatever the maps hold (ops on one side, on both, an empty or nil
// list) and whether splice has room to work in place: checked against the
// plain loop.
func TestPropertySpliceMatchesTheLoop(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 40).Draw(rt, "ops")
		old := make([]ir.Op, n)
		for i := range old {
			old[i].Name = fmt.Sprint("op", i)
		}
		inserts := func(label string) map[int][]ir.Op {
			m := map[int][]ir.Op{}
			for range rapid.IntRange(0, n).Draw(rt, label+" anchors") {
				i := rapid.IntRange(0, max(n-1, 0)).Draw(rt, label+" at")
				if n == 0 {
					break
				}
				var ops []ir.Op
				switch k := rapid.IntRange(-1, 3).Draw(rt, label+" ops"); k {
				case -1: // nil
				case 0:
					ops = []ir.Op{}
				default:
					for j := range k {
						ops = append(ops, ir.Op{Name: fmt.Sprintf("%s%d.%d", label, i, j)})
					}
				}
				m[i] = ops
			}
			return m
		}
		before, after := inserts("b"), inserts("a")
		var edits []opEdit
		var ins []inEdit
		wantIn := map[string][]ir.TensorID{}
		for i := range n {
			switch rapid.IntRange(0, 5).Draw(rt, "edit") {
			case 0:
				edits = append(edits, opEdit{at: i, op: ir.Op{Name: fmt.Sprint("edited", i)}})
			case 1:
				in := []ir.TensorID{ir.TensorID(1000 + i)}
				ins = append(ins, inEdit{at: i, in: in})
				wantIn[old[i].Name] = in
			}
		}
		names := func(ops []ir.Op) []string {
			out := make([]string, len(ops))
			for i := range ops {
				out[i] = ops[i].Name
			}
			return out
		}
		var want, wantEdited []string
		k := 0
		for i := range old {
			want = append(want, names(before[i])...)
			wantEdited = append(wantEdited, names(before[i])...)
			want = append(want, old[i].Name)
			if k < len(edits) && edits[k].at == i {
				wantEdited = append(wantEdited, edits[k].op.Name)
				k++
			} else {
				wantEdited = append(wantEdited, old[i].Name)
			}
			want = append(want, names(after[i])...)
			wantEdited = append(wantEdited, names(after[i])...)
		}
		input := names(old)
		copied := spliceCopy(old, before, after, edits, ins)
		if got := names(copied); !slices.Equal(got, wantEdited) {
			rt.Fatalf("spliceCopy: %v, want %v", got, wantEdited)
		}
		for _, op := range copied {
			if !slices.Equal(op.In, wantIn[op.Name]) {
				rt.Fatalf("spliceCopy: %s reads %v, want %v", op.Name, op.In, wantIn[op.Name])
			}
		}
		if got := names(old); !slices.Equal(got, input) || slices.ContainsFunc(old, func(op ir.Op) bool { return op.In != nil }) {
			rt.Fatalf("spliceCopy wrote its input: %v", got)
		}
		room := rapid.IntRange(0, 2*n+8).Draw(rt, "room")
		in := append(make([]ir.Op, 0, n+room), old...)
		if got := names(splice(in, before, after)); !slices.Equal(got, want) {
			rt.Fatalf("splice with room %d: %v, want %v", room, got, want)
		}
	})
}
