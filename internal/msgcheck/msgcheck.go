// Package msgcheck finds what a user-visible message must not contain: a
// Go package prefix ("engine: "), a Go library's own wording ("time:
// invalid duration", "error unmarshaling JSON"), a qualified Go identifier
// ("strategy.DefaultReduceBucketElems", "PriceOptions.DType") or the name
// of a field of the job as the code spells it ("MicroBatch"). Tests run it
// over every error the CLI's table tests produce and over the libraries'
// validation messages.
package msgcheck

import (
	"reflect"
	"regexp"
	"strings"
	"unicode"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/fieldpath"
)

// packages are this module's package names.
const packages = `engine|search|validate|published|workload|strategy|torchtrace|cost|lower|plan|models|build|hw|units|ir|sim|ops|report|ckpt|allocator|snapshot|cli|fieldpath|msgcheck`

var (
	prefix    = regexp.MustCompile(`(^|[\s(;:"'])(` + packages + `): `)
	qualified = regexp.MustCompile(`\b(` + packages + `|[a-z][a-z0-9]*)\.[A-Z][A-Za-z0-9]*\b`)
	typeField = regexp.MustCompile(`\b[A-Z][a-z0-9]+[A-Z]\w*\.[A-Z]\w*`)
	errVar    = regexp.MustCompile(`\bErr[A-Z]\w*`)
	// library is a Go library's own wording quoted whole: strconv's
	// "strconv.ParseInt: parsing", time's "time: invalid duration",
	// sigs.k8s.io/yaml's and encoding/json's steps, net's "listen tcp"
	// (issue 15's probe corpus found each in a refusal).
	library = regexp.MustCompile(`strconv\.\w+: |\btime: invalid|error unmarshaling JSON|error converting YAML|while decoding JSON|(^|[\s(;:"'])(json|yaml): |listen tcp|invalid syntax\b`)
	word    = regexp.MustCompile(`[A-Za-z][A-Za-z0-9]*`)
)

// words are terms users write that look like compound identifiers.
var words = map[string]bool{"LoRA": true, "QLoRA": true, "ZeRO": true, "GiB": true, "MiB": true, "KiB": true, "TiB": true, "PyTorch": true}

// identifiers are the code's names for the job: Spec's fields and its
// parts' types, where they are compounds a person would not write.
var identifiers = func() map[string]bool {
	m := map[string]bool{}
	add := func(name string) {
		if compound(name) && !words[name] {
			m[name] = true
		}
	}
	t := reflect.TypeOf(engine.Spec{})
	for _, l := range fieldpath.Leaves(t) {
		for _, part := range strings.Split(l.Path, ".") {
			add(part)
		}
	}
	for _, v := range []any{engine.Spec{}, engine.Options{}, engine.CheckpointPolicy{}, engine.Semantics{}, engine.Counter{}, engine.Allow{}} {
		add(reflect.TypeOf(v).Name())
	}
	return m
}()

// compound reports whether name has a lower-case letter followed by an
// upper-case one ("MicroBatch", "PPStages" does not, "TraceOptimizer" does).
func compound(name string) bool {
	r := []rune(name)
	for i := 1; i < len(r); i++ {
		if unicode.IsLower(r[i-1]) && unicode.IsUpper(r[i]) {
			return true
		}
	}
	return false
}

// Problems lists what msg must not contain (none: nil).
func Problems(msg string) []string {
	var out []string
	if m := prefix.FindStringSubmatch(msg); m != nil {
		out = append(out, "package prefix "+m[2]+": ")
	}
	for _, re := range []*regexp.Regexp{qualified, typeField, errVar} {
		if m := re.FindString(msg); m != "" {
			out = append(out, "Go identifier "+m)
		}
	}
	if m := library.FindString(msg); m != "" {
		out = append(out, "a Go library's wording "+strings.TrimSpace(m))
	}
	for _, w := range word.FindAllString(msg, -1) {
		if identifiers[w] {
			out = append(out, "field name "+w)
		}
	}
	if strings.Contains(msg, "{") && strings.Contains(msg, "}") {
		for _, f := range engine.Fields() {
			if strings.Contains(msg, "{"+f.Key()+"}") {
				out = append(out, "unrendered field {"+f.Key()+"}")
			}
		}
	}
	return out
}
