// Package fieldpath lists the leaf fields of a struct type and changes them
// one at a time. Tests use it to check that a key derived from a struct (a
// cache's, a search's) changes with every field it should and with no
// other, so a field added to the struct cannot be silently left out.
package fieldpath

import (
	"fmt"
	"reflect"
	"unsafe"
)

// Leaf is a field that is not itself a struct: Path names it from the root
// ("Job.MicroBatch"), Index reaches it (reflect.Value.FieldByIndex).
type Leaf struct {
	Path  string
	Index []int
}

// Leaves lists the leaf fields of struct type t in declaration order,
// descending into struct-typed fields (embedded or named) but not through
// pointers.
func Leaves(t reflect.Type) []Leaf {
	var out []Leaf
	var walk func(t reflect.Type, path string, index []int)
	walk = func(t reflect.Type, path string, index []int) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			p := f.Name
			if path != "" {
				p = path + "." + f.Name
			}
			idx := append(append([]int(nil), index...), i)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, p, idx)
				continue
			}
			out = append(out, Leaf{Path: p, Index: idx})
		}
	}
	walk(t, "", nil)
	return out
}

// Change sets leaf l of the struct v points to to a value different from
// its current one (unexported fields included).
func Change(v any, l Leaf) {
	f := reflect.ValueOf(v).Elem().FieldByIndex(l.Index)
	if !f.CanSet() {
		f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
	}
	switch f.Kind() {
	case reflect.Bool:
		f.SetBool(!f.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f.SetInt(f.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		f.SetUint(f.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		f.SetFloat(f.Float() + 1)
	case reflect.String:
		f.SetString(f.String() + "x")
	case reflect.Pointer:
		f.Set(reflect.New(f.Type().Elem()))
	default:
		panic(fmt.Sprintf("fieldpath: cannot change %s of kind %s", l.Path, f.Kind()))
	}
}
