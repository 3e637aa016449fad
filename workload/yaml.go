package workload

import (
	"errors"
	"math"
	"math/big"
	"strconv"
	"strings"

	yaml "sigs.k8s.io/yaml/goyaml.v3"

	"github.com/memplan/memplan/internal/yamlerr"
)

// bigInt is an integer outside int64, as written (decimal, normalised); a
// field's range check names it.
type bigInt string

// decodeYAML reads one YAML document into plain values with the table's
// scalar rules (fields.json "scalars"), as memplan_torch/workload.py's
// _decode does: plain scalars resolve to null, booleans, decimal integers
// (int64, or bigInt outside it) and floats by those patterns, every other
// scalar is a string; aliases expand; explicit tags, merge keys, duplicate
// keys, keys that are not strings and several documents are refused.
func decodeYAML(where string, data []byte) (any, error) {
	doc, err := yamlerr.OneDocument(data, "a workload")
	if errors.Is(err, yamlerr.ErrRefused) {
		return nil, bad(where, "%s", err.Error())
	}
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		return nil, bad(where, "invalid YAML: %s", strings.ReplaceAll(msg, "\n", " "))
	}
	if doc == nil {
		return nil, nil
	}
	c := &converter{where: where}
	return c.value(doc, "", 0)
}

// converter turns nodes into values, counting them (aliases expanded).
type converter struct {
	where string
	count int
}

// An alias is the value it names, at the alias's depth, and neither it nor
// the document node is a value of its own: memplan_torch's _Decoder counts
// the same (sweep G, round 25: Go counted both and a level per alias, and
// refused files at the limits that Python read).
func (c *converter) value(n *yaml.Node, path string, depth int) (any, error) {
	if n.Kind == yaml.AliasNode {
		return c.value(n.Alias, path, depth)
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil, nil
		}
		return c.value(n.Content[0], path, depth)
	}
	c.count++
	if c.count > table.Limits.Values {
		return nil, bad(c.where, "the document expands to over %d values (aliases included)", table.Limits.Values)
	}
	if depth > table.Limits.Depth {
		return nil, bad(c.where, "%s nests deeper than %d levels", fieldName(path), table.Limits.Depth)
	}
	if n.Style&yaml.TaggedStyle != 0 {
		return nil, bad(c.where, "%s has an explicit YAML tag (%s); write the value plainly", fieldName(path), n.Tag)
	}
	switch n.Kind {
	case yaml.MappingNode:
		return c.mapping(n, path, depth)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			v, err := c.value(e, path, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return c.scalar(n, path)
}

func (c *converter) mapping(n *yaml.Node, path string, depth int) (any, error) {
	out := make(map[string]any, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn := n.Content[i]
		for kn.Kind == yaml.AliasNode {
			kn = kn.Alias
		}
		if kn.Kind == yaml.ScalarNode && kn.Style&^yaml.TaggedStyle == 0 && kn.Value == "<<" {
			return nil, bad(c.where, "merge keys ('<<') are not supported; write the fields out")
		}
		k, err := c.value(kn, path, depth+1)
		if err != nil {
			return nil, err
		}
		ks, ok := k.(string)
		if !ok {
			return nil, bad(c.where, "a mapping key must be a string, got %s", describe(k))
		}
		name := ks
		if path != "" {
			name = path + "." + ks
		}
		if _, dup := out[ks]; dup {
			return nil, bad(c.where, "field '%s' is given twice", name)
		}
		v, err := c.value(n.Content[i+1], name, depth+1)
		if err != nil {
			return nil, err
		}
		out[ks] = v
	}
	return out, nil
}

// scalar resolves a scalar: quoted and block scalars are strings, plain
// ones by the table's patterns.
func (c *converter) scalar(n *yaml.Node, path string) (any, error) {
	s := n.Value
	if n.Style != 0 {
		return s, nil
	}
	switch {
	case scalars.null.MatchString(s):
		return nil, nil
	case scalars.bool.MatchString(s):
		return strings.ToLower(s) == "true", nil
	case scalars.int.MatchString(s):
		if v, err := strconv.ParseInt(s, 10, 64); err == nil {
			return v, nil
		}
		b, _ := new(big.Int).SetString(strings.TrimPrefix(s, "+"), 10)
		return bigInt(b.String()), nil
	case scalars.float.MatchString(s):
		if f := parseFloat(s); !math.IsInf(f, 0) && !math.IsNaN(f) {
			return f, nil
		}
		return nil, bad(c.where, "%s must be a finite number, got %s (JSON has no infinities or NaN)", fieldName(path), s)
	}
	return s, nil
}

// parseFloat reads a float the table's pattern matched (.inf and .nan
// included).
func parseFloat(s string) float64 {
	t := strings.ToLower(strings.TrimLeft(s, "+-"))
	switch t {
	case ".inf":
		if strings.HasPrefix(s, "-") {
			return math.Inf(-1)
		}
		return math.Inf(1)
	case ".nan":
		return math.NaN()
	}
	v, _ := strconv.ParseFloat(s, 64) // ±Inf past float64's range, as Python's float()
	return v
}

// fieldName names the field at path for a message ("the document" at the
// top).
func fieldName(path string) string {
	if path == "" {
		return "the document"
	}
	return "field '" + path + "'"
}
