package ir

import (
	"reflect"
	"testing"

	"github.com/memplan/memplan/units"
)

// SameButNames reads every field of a graph, a tensor and a node but the
// names: changing any one of them in a copy makes the graphs differ,
// changing a name does not. A field added to those types fails here until
// SameButNames reads it (or names it as a name).
func TestSameButNamesReadsEveryField(t *testing.T) {
	base := func() *Graph {
		return &Graph{
			Tensors: []Tensor{{Name: "x", Shape: []int64{2, 3}, Bytes: 24, Base: NoTensor, DType: units.F32}, {Name: "y", Shape: []int64{2}, Bytes: 8, Base: NoTensor}},
			Nodes: []Node{{Kind: "linear", Module: "model.layers.0", In: []TensorID{0}, Out: []TensorID{1}, Saved: []TensorID{0},
				GradSaved: map[int]int{0: 0}, NoGrad: []int{1}, Comm: &Comm{Kind: AllReduce, Bytes: 8, Group: TensorGroup, Ranks: 2}}},
			Params: []TensorID{0}, Inputs: []TensorID{1}, Loss: 1, Buffers: []TensorID{0}, Outputs: []TensorID{1},
		}
	}
	if !SameButNames(base(), base()) {
		t.Fatal("a graph differs from its copy")
	}
	names := map[string]bool{"Tensor.Name": true, "Node.Module": true}
	for _, typ := range []struct {
		name string
		v    func(g *Graph) reflect.Value
	}{
		{"Graph", func(g *Graph) reflect.Value { return reflect.ValueOf(g).Elem() }},
		{"Tensor", func(g *Graph) reflect.Value { return reflect.ValueOf(&g.Tensors[0]).Elem() }},
		{"Node", func(g *Graph) reflect.Value { return reflect.ValueOf(&g.Nodes[0]).Elem() }},
	} {
		n := typ.v(base()).NumField()
		for i := range n {
			g := base()
			f := typ.v(g).Field(i)
			name := typ.name + "." + typ.v(g).Type().Field(i).Name
			change(t, name, f)
			if same := SameButNames(base(), g); same != names[name] {
				t.Errorf("%s changed: same %v, want %v", name, same, names[name])
			}
		}
	}
}

// change sets v to a value other than its own.
func change(t *testing.T, name string, v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "'")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.Slice:
		if v.Len() > 0 && v.Index(0).Kind() != reflect.Struct {
			change(t, name, v.Index(0))
		} else if v.Len() > 0 {
			v.Set(v.Slice(0, v.Len()-1))
		} else {
			t.Fatalf("%s: an empty slice to change", name)
		}
	case reflect.Map:
		v.SetMapIndex(reflect.ValueOf(7), reflect.ValueOf(7))
	case reflect.Pointer:
		e := reflect.New(v.Type().Elem())
		if !v.IsNil() {
			e.Elem().Set(v.Elem())
			change(t, name, e.Elem().Field(0))
		}
		v.Set(e)
	default:
		t.Fatalf("%s: a field of kind %v to change", name, v.Kind())
	}
}
