package pack

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// exactKeys refuses a key of js that is not the name of a field of t as
// written. encoding/json matches keys case-insensitively (and with
// Unicode's folding: "ſnapshot" is snapshot), so without this "Model:"
// would be read as model: while the service's check for keys that name
// files on its disk (cli selfContained) reads keys as written, and a job
// file would mean something its documented, lower-case keys do not say.
func exactKeys(js []byte, t reflect.Type) error {
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil // the typed decoding says what is wrong
	}
	return keysOf(doc, t, "")
}

func keysOf(v any, t reflect.Type, at string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := v.(type) {
	case map[string]any:
		if t.Kind() != reflect.Struct {
			return nil
		}
		fields := jsonFields(t)
		for _, k := range slices.Sorted(maps.Keys(v)) {
			ft, ok := fields[k]
			if !ok {
				return unknownKey(k, at, fields)
			}
			if err := keysOf(v[k], ft, join(at, k)); err != nil {
				return err
			}
		}
	case []any:
		if t.Kind() != reflect.Slice {
			return nil
		}
		for i, e := range v {
			if err := keysOf(e, t.Elem(), fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonFields are the keys of struct t (their json tags) and their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func unknownKey(k, at string, fields map[string]reflect.Type) error {
	where := ""
	if at != "" {
		where = at + ": "
	}
	for name := range fields {
		if strings.EqualFold(name, k) {
			return fmt.Errorf("%sunknown key %q (keys are written as documented: %s)", where, k, name)
		}
	}
	return fmt.Errorf("%sunknown key %q", where, k)
}

func join(at, k string) string {
	if at == "" {
		return k
	}
	return at + "." + k
}
