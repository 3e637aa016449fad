// Package recipe describes how the frameworks people train with run a job,
// where they differ in what decides memory: precision policy, optimizer
// state, loss, LoRA and 4-bit semantics, training-loop habits, and the
// device memory that lives outside PyTorch's allocator. A recipe is data
// (recipes/*.yaml, embedded): a value for each switch, with the framework
// source it follows. Switches are rows of one table (switches.go).
package recipe

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/internal/yamlerr"
)

//go:embed recipes/*.yaml
var embedded embed.FS

// Recipe is one framework's way of running a job.
type Recipe struct {
	// Name is how --recipe names it.
	Name string `json:"name"`
	// Framework and Version say what it follows.
	Framework string `json:"framework"`
	Version   string `json:"version"`
	Doc       string `json:"doc"`
	// Settings are its switch values, in order; a later one wins.
	Settings []Setting `json:"switches"`
}

// Setting is one switch value and where it comes from.
type Setting struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Source string `json:"source"`
}

// ErrRecipe wraps every recipe error.
var ErrRecipe = errors.New("recipe")

// ErrUnknownRecipe is a name that is neither an embedded recipe nor a path.
var ErrUnknownRecipe = errors.New("unknown recipe")

// maxFileBytes bounds a recipe file, and what its aliases may expand it to.
const maxFileBytes = 1 << 20

// Parse reads a recipe file (YAML or JSON) and checks every setting.
func Parse(data []byte, name string) (*Recipe, error) {
	var r Recipe
	if err := yamlerr.UnmarshalStrict(data, &r, maxFileBytes); err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrRecipe, name, yamlerr.Message(err))
	}
	if strings.TrimSpace(r.Name) == "" {
		return nil, fmt.Errorf("%w: %s: no name: a recipe file is YAML with name: and switches: (key, value, source), as memplan recipes NAME prints", ErrRecipe, name)
	}
	first := map[string]int{}
	for i, st := range r.Settings {
		if err := check(st.Key, st.Value); err != nil {
			return nil, fmt.Errorf("%w: %s: switch %d: %v", ErrRecipe, name, i+1, err)
		}
		// Applied in order, the last of two would win unseen; a file
		// says each switch once (--set is what overrides).
		if j, ok := first[st.Key]; ok {
			return nil, fmt.Errorf("%w: %s: switch %d sets %s again (switch %d set it)", ErrRecipe, name, i+1, st.Key, j+1)
		}
		first[st.Key] = i
	}
	return &r, nil
}

// check validates key=value by applying it to a scratch spec.
func check(key, value string) error {
	sw, err := lookup(key)
	if err != nil {
		return err
	}
	var s engine.Spec
	if err := sw.apply(&s, strings.TrimSpace(value)); err != nil {
		if strings.Contains(err.Error(), sw.Values) {
			return fmt.Errorf("%s=%q: %v", key, value, err) // it lists them already
		}
		return fmt.Errorf("%s=%q: %v (allowed: %s)", key, value, err, sw.Values)
	}
	return nil
}

// List returns the embedded recipes, sorted by name.
func List() ([]*Recipe, error) {
	rs, err := embeddedRecipes()
	if err != nil {
		return nil, err
	}
	out := make([]*Recipe, len(rs))
	for i, r := range rs {
		out[i] = r.Clone()
	}
	return out, nil
}

// embeddedRecipes parses the embedded recipes once: List runs on every
// plan (plan's flags name the recipes in their help), and parsing each
// YAML every time was 7% of a new plan's CPU in the service
// (server.BenchmarkNewPlan70B's profile). List hands out copies.
var embeddedRecipes = sync.OnceValues(func() ([]*Recipe, error) {
	entries, err := embedded.ReadDir("recipes")
	if err != nil {
		return nil, err
	}
	var out []*Recipe
	for _, e := range entries {
		data, err := embedded.ReadFile(path.Join("recipes", e.Name()))
		if err != nil {
			return nil, err
		}
		r, err := Parse(data, e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *Recipe) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
})

// Names lists the embedded recipes' names.
func Names() []string {
	rs, _ := List()
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name
	}
	return out
}

// Load finds an embedded recipe by name, or reads a recipe file.
func Load(nameOrPath string) (*Recipe, error) {
	rs, err := List()
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if r.Name == nameOrPath {
			return r, nil
		}
	}
	if !strings.ContainsAny(nameOrPath, "/.") {
		return nil, fmt.Errorf("%w: %w %q (recipes: %s; or give a recipe file)", ErrRecipe, ErrUnknownRecipe, nameOrPath, strings.Join(Names(), ", "))
	}
	data, err := boundedio.ReadFile(nameOrPath, maxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRecipe, err)
	}
	return Parse(bytes.TrimSpace(data), nameOrPath)
}

// Set adds a key=value override (the --set flag), after the recipe's own.
func (r *Recipe) Set(kv string) error {
	key, value, ok := strings.Cut(kv, "=")
	key, value = strings.TrimSpace(key), strings.TrimSpace(value)
	if !ok || key == "" {
		return fmt.Errorf("%w: %w", ErrRecipe, engine.FieldErrorf(engine.FieldSet, "{set} %q: want key=value (memplan recipes NAME lists the keys)", kv))
	}
	if err := check(key, value); err != nil {
		return fmt.Errorf("%w: %w", ErrRecipe, engine.FieldErrorf(engine.FieldSet, "{set} %v", err))
	}
	r.Settings = append(r.Settings, Setting{Key: key, Value: value, Source: "--set"})
	return nil
}

// Value is the value the recipe gives key ("" when it sets none).
func (r *Recipe) Value(key string) string {
	v := ""
	for _, st := range r.Settings {
		if st.Key == key {
			v = st.Value
		}
	}
	return v
}

// Apply sets the spec's fields from the recipe. A setting whose switch
// mirrors a flag (Switch.Flag) yields to the flag when explicit(flag)
// reports that the user gave it: a recipe's own value is skipped, and a
// --set one must set what the flag set (a *Disagreement when it does
// not). explicit may be nil. An inference spec skips the training
// switches (Switch.Training): a recipe's checkpointing or loss is its
// training step's (TrainingOnly names a --set of one to warn about).
func (r *Recipe) Apply(s *engine.Spec, explicit func(flag string) bool) error {
	s.Sem.Recipe = r.Name
	for _, st := range r.Settings {
		sw, err := lookup(st.Key)
		if err != nil {
			return err
		}
		if sw.Training && s.Mode == engine.Infer {
			continue
		}
		given := sw.Flag != "" && explicit != nil && explicit(sw.Flag)
		if given && st.Source != "--set" {
			continue
		}
		// A --set of a given flag's switch is applied to a copy: the
		// flag set the spec first, so a copy the setting changes is a
		// value the user gave twice, differently. Compared by effect,
		// not by text, so spellings of one value (bf16-mixed and
		// amp-bf16) agree.
		t := s
		if given {
			c := *s
			t = &c
		}
		if err := sw.apply(t, st.Value); err != nil {
			return fmt.Errorf("%w: %s: %s=%q: %v", ErrRecipe, r.Name, st.Key, st.Value, err)
		}
		if given && *t != *s {
			return &Disagreement{Flag: sw.Flag, Key: st.Key, Value: st.Value}
		}
	}
	return nil
}

// TrainingOnly reports whether key names a switch only a training step
// has (Switch.Training), which an inference plan ignores.
func TrainingOnly(key string) bool {
	sw, err := lookup(strings.TrimSpace(key))
	return err == nil && sw.Training
}

// Disagreement is a --set setting of a switch whose flag the user also
// gave, to another value: neither may silently win over the other, and
// the CLI names both with the flag's value.
type Disagreement struct {
	// Flag is the switch's flag (Switch.Flag, without dashes).
	Flag string
	// Key and Value are the setting.
	Key, Value string
}

func (e *Disagreement) Error() string {
	return fmt.Sprintf("%v: %s given and set %s=%s disagree", ErrRecipe, e.Flag, e.Key, e.Value)
}

// Unwrap makes a Disagreement a recipe error (errors.Is ErrRecipe).
func (e *Disagreement) Unwrap() error { return ErrRecipe }

// Clone is a copy that Set does not share.
func (r *Recipe) Clone() *Recipe {
	c := *r
	c.Settings = slices.Clone(r.Settings)
	return &c
}
