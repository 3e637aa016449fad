package workload

import (
	"bytes"
	_ "embed" // fields.json
	"encoding/json"
	"regexp"
)

// fieldsJSON is the table of a workload's fields, and of how its YAML
// scalars read, that memplan_torch/workload.py reads too: one table, so the
// two readers cannot drift apart.
//
//go:embed fields.json
var fieldsJSON []byte

// fieldSpec is one field of the table.
type fieldSpec struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"` // integer, string, boolean, mapping
	Default  any      `json:"default"`
	Required bool     `json:"required"`
	Min      *int64   `json:"min"`
	Max      *int64   `json:"max"`
	Choices  []string `json:"choices"`
	// Aliases are other spellings of Choices (dtype's fp32, half, ...),
	// kept as written.
	Aliases map[string]string `json:"aliases"`
}

// fieldTable is fields.json.
type fieldTable struct {
	Schema  string `json:"schema"`
	Scalars struct {
		Null, Bool, Int, Float string
	} `json:"scalars"`
	Limits struct {
		Bytes, Values, Depth int
	} `json:"limits"`
	Text struct {
		Unprintable, Directive string
	} `json:"text"`
	Top      []fieldSpec `json:"top"`
	Strategy []fieldSpec `json:"strategy"`
}

// scalarRes are the table's plain-scalar patterns, compiled.
type scalarRes struct{ null, bool, int, float *regexp.Regexp }

// textRes are the table's patterns of the file's text, compiled.
type textRes struct{ unprintable, directive *regexp.Regexp }

var (
	table   = mustTable()
	scalars = scalarRes{regexp.MustCompile(table.Scalars.Null), regexp.MustCompile(table.Scalars.Bool),
		regexp.MustCompile(table.Scalars.Int), regexp.MustCompile(table.Scalars.Float)}
	text = textRes{regexp.MustCompile(table.Text.Unprintable), regexp.MustCompile(table.Text.Directive)}
)

func mustTable() *fieldTable {
	var t fieldTable
	dec := json.NewDecoder(bytes.NewReader(fieldsJSON))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&struct {
		About string `json:"about"`
		*fieldTable
	}{fieldTable: &t}); err != nil {
		panic("workload/fields.json: " + err.Error()) // embedded: a build that breaks it fails every test
	}
	for _, fs := range [][]fieldSpec{t.Top, t.Strategy} {
		for i := range fs {
			if n, ok := fs[i].Default.(json.Number); ok {
				v, err := n.Int64()
				if err != nil {
					panic("workload/fields.json: default of " + fs[i].Name + ": " + err.Error())
				}
				fs[i].Default = v
			}
		}
	}
	return &t
}

// choices are the spellings field name (of the top-level fields, or
// strategy.NAME) accepts.
func choices(name string) []string {
	for _, f := range table.Top {
		if f.Name == name {
			return f.Choices
		}
	}
	for _, f := range table.Strategy {
		if "strategy."+f.Name == name {
			return f.Choices
		}
	}
	return nil
}
