package cli

import (
	"encoding/json"
	"sync"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/recipe"
)

// catalogJSON is GET /v1/catalog (memplan.catalog/v1): what a request may
// name, for the web page's pickers. The same embedded catalogs memplan
// models, gpus and recipes list.
type catalogJSON struct {
	Schema  string          `json:"schema"`
	Models  []catalogModel  `json:"models"`
	GPUs    []catalogGPU    `json:"gpus"`
	Recipes []catalogRecipe `json:"recipes"`
}

type catalogModel struct {
	Name   string `json:"name"`
	Family string `json:"family"`
	Params int64  `json:"params"`
}

type catalogGPU struct {
	Name string `json:"name"`
	// MemoryBytes is what a process can allocate (hw.GPU.Capacity, what
	// plans are checked against).
	MemoryBytes int64 `json:"memory_bytes"`
}

type catalogRecipe struct {
	Name      string `json:"name"`
	Framework string `json:"framework"`
	// Fields are the request fields the recipe sets, with its values: its
	// switches that a plan flag also sets (recipe.Switch.Flag), keyed as
	// requests write the flag. A field given in a request wins over the
	// recipe's value; the page shows these in its controls when the
	// recipe is chosen.
	Fields map[string]string `json:"fields"`
}

// Catalog is the service's GET /v1/catalog document (server.Cataloger).
func (APIBackend) Catalog() ([]byte, error) { return apiCatalog() }

var apiCatalog = sync.OnceValues(func() ([]byte, error) {
	c := catalogJSON{Schema: "memplan.catalog/v1"}
	for _, e := range models.Catalog() {
		c.Models = append(c.Models, catalogModel{Name: e.Name, Family: e.Family, Params: e.Params})
	}
	for _, g := range hw.All() {
		c.GPUs = append(c.GPUs, catalogGPU{Name: g.Name, MemoryBytes: int64(g.Capacity())})
	}
	rs, err := recipe.List()
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		cr := catalogRecipe{Name: r.Name, Framework: r.Framework, Fields: map[string]string{}}
		for _, sw := range recipe.Switches() {
			if v := r.Value(sw.Key); sw.Flag != "" && v != "" {
				cr.Fields[apiKey(sw.Flag)] = v
			}
		}
		c.Recipes = append(c.Recipes, cr)
	}
	return json.Marshal(c)
})
