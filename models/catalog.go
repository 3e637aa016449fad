package models

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/agnivade/levenshtein"
	"github.com/memplan/memplan/internal/boundedio"
)

// The catalog holds real HuggingFace config.json files, one per model, named
// <catalog name>.json. They are copied from the HF repositories listed in
// catalogRepos, with one exception: catalog/vit-base.json replaces the 1000
// ImageNet class names of id2label/label2id with the equivalent
// "num_labels": 1000 (which PretrainedConfig also accepts); the names do not
// change the architecture. And catalog/deepseek-v3.json leaves out the
// checkpoint's quantization_config (block-wise fp8, 128x128 scales, which
// memplan refuses by name): the entry is the BF16 model DeepSeek's
// inference/fp8_cast_bf16.py converts it to, the one training recipes load.
//
//go:embed catalog/*.json
var catalogFS embed.FS

// catalogRepos maps catalog names to the HuggingFace repository whose
// config.json the catalog file reproduces.
var catalogRepos = map[string]string{
	"bert-base":        "google-bert/bert-base-uncased",
	"bert-large":       "google-bert/bert-large-uncased",
	"deepseek-v2":      "deepseek-ai/DeepSeek-V2",
	"deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite",
	"deepseek-v3":      "deepseek-ai/DeepSeek-V3",
	"gemma-2-9b":       "google/gemma-2-9b",
	"gemma-2b":         "google/gemma-2b",
	"gemma-3-1b":       "google/gemma-3-1b-pt",
	"gemma-7b":         "google/gemma-7b",
	"gpt2":             "openai-community/gpt2",
	"gpt2-large":       "openai-community/gpt2-large",
	"gpt2-medium":      "openai-community/gpt2-medium",
	"gpt2-xl":          "openai-community/gpt2-xl",
	"llama-2-13b":      "meta-llama/Llama-2-13b-hf",
	"llama-2-70b":      "meta-llama/Llama-2-70b-hf",
	"llama-2-7b":       "meta-llama/Llama-2-7b-hf",
	"llama-3-70b":      "meta-llama/Meta-Llama-3-70B",
	"llama-3-8b":       "meta-llama/Meta-Llama-3-8B",
	"llama-3.1-8b":     "meta-llama/Llama-3.1-8B",
	"llama-3.2-1b":     "meta-llama/Llama-3.2-1B",
	"mistral-7b":       "mistralai/Mistral-7B-v0.1",
	"mixtral-8x7b":     "mistralai/Mixtral-8x7B-v0.1",
	"phi-2":            "microsoft/phi-2",
	"falcon-7b":        "tiiuae/falcon-7b",
	"qwen3-30b-a3b":    "Qwen/Qwen3-30B-A3B",
	"phi-1.5":          "microsoft/phi-1_5",
	"phi-3-mini":       "microsoft/Phi-3-mini-4k-instruct",
	"pythia-1.4b":      "EleutherAI/pythia-1.4b",
	"pythia-160m":      "EleutherAI/pythia-160m",
	"qwen2.5-0.5b":     "Qwen/Qwen2.5-0.5B",
	"qwen2.5-7b":       "Qwen/Qwen2.5-7B",
	"qwen2.5-32b-it":   "Qwen/Qwen2.5-32B-Instruct",
	"qwen3-8b":         "Qwen/Qwen3-8B",
	"tinyllama-1.1b":   "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
	"vit-base":         "google/vit-base-patch16-224",
}

var (
	catalogOnce  sync.Once
	catalogNames []string
	catalogData  map[string][]byte
)

func loadCatalog() {
	catalogOnce.Do(func() {
		catalogData = map[string][]byte{}
		entries, err := catalogFS.ReadDir("catalog")
		if err != nil {
			return // cannot happen with a successful go:embed
		}
		for _, e := range entries {
			if e.IsDir() || path.Ext(e.Name()) != ".json" {
				continue
			}
			data, err := catalogFS.ReadFile("catalog/" + e.Name())
			if err != nil {
				continue
			}
			name := strings.TrimSuffix(e.Name(), ".json")
			catalogData[name] = data
			catalogNames = append(catalogNames, name)
		}
		sort.Strings(catalogNames)
	})
}

// Names returns the catalog model names, sorted.
func Names() []string {
	loadCatalog()
	return append([]string(nil), catalogNames...)
}

// ErrUnknownModel is a name that is not in the catalog.
var ErrUnknownModel = errors.New("unknown model")

// Lookup returns the catalog architecture with the given name (case
// insensitive; the HuggingFace repository id, e.g. "meta-llama/Llama-2-7b-hf",
// is accepted too). An unknown name yields an error suggesting the three
// closest catalog names by edit distance. Each call returns a fresh Arch.
func Lookup(name string) (*Arch, error) {
	loadCatalog()
	key := strings.ToLower(strings.TrimSpace(name))
	if _, ok := catalogData[key]; !ok {
		for n, repo := range catalogRepos {
			if strings.ToLower(repo) == key {
				key = n
				break
			}
		}
	}
	data, ok := catalogData[key]
	if !ok {
		return nil, fmt.Errorf("%w %q; did you mean %s?", ErrUnknownModel, name, strings.Join(Suggest(name, 3), ", "))
	}
	return ParseHFConfig(data, key)
}

// Suggest returns up to n catalog names closest to name, nearest first,
// ties in name order. Closeness is the Levenshtein distance (case
// insensitive) to the whole catalog name, or, if smaller, one more than the
// distance to the name's prefix of the same length, so that "bert" or
// "mistral" suggest bert-base or mistral-7b before a short unrelated name.
func Suggest(name string, n int) []string {
	loadCatalog()
	key := strings.ToLower(strings.TrimSpace(name))
	type cand struct {
		name string
		d    int
	}
	cs := make([]cand, 0, len(catalogNames))
	for _, c := range catalogNames {
		d := levenshtein.ComputeDistance(key, c)
		if len(key) > 0 && len(key) < len(c) {
			if pd := levenshtein.ComputeDistance(key, c[:len(key)]) + 1; pd < d {
				d = pd
			}
		}
		cs = append(cs, cand{c, d})
	}
	sort.SliceStable(cs, func(i, j int) bool {
		if cs[i].d != cs[j].d {
			return cs[i].d < cs[j].d
		}
		return cs[i].name < cs[j].name
	})
	n = min(max(n, 0), len(cs))
	out := make([]string, n)
	for i := range out {
		out[i] = cs[i].name
	}
	return out
}

// InCatalog reports whether name is a catalog model's name or HuggingFace
// repository (as Lookup reads them), without reading any file.
func InCatalog(name string) bool {
	loadCatalog()
	key := strings.ToLower(strings.TrimSpace(name))
	if _, ok := catalogData[key]; ok {
		return true
	}
	for _, repo := range catalogRepos {
		if strings.ToLower(repo) == key {
			return true
		}
	}
	return false
}

// Resolve loads an architecture from a catalog name or a config.json path:
// a catalog name (or repository) is the catalog's model even where a file or
// directory of that name exists (write ./NAME for it), so a name never
// reads the disk of whoever resolves it (the service, the extender); an
// argument naming an existing file or directory, or ending in ".json", is
// read from disk; anything else is looked up in the catalog (and refused
// with suggestions).
func Resolve(nameOrPath string) (*Arch, error) {
	if InCatalog(nameOrPath) {
		return Lookup(nameOrPath)
	}
	st, err := os.Stat(nameOrPath)
	if err == nil && st.IsDir() {
		return LoadSnapshot(nameOrPath)
	}
	if err == nil {
		return LoadFile(nameOrPath)
	}
	if strings.HasSuffix(strings.ToLower(nameOrPath), ".json") {
		return LoadFile(nameOrPath)
	}
	return Lookup(nameOrPath)
}

// Entry is one catalog model for listings such as `memplan models`.
type Entry struct {
	Name        string // catalog name
	Repo        string // HuggingFace repository the config comes from
	Family      string
	Params      int64
	Description string // one line: family, params, shape
}

// Catalog lists every catalog model with its one-line description, sorted
// by name.
func Catalog() []Entry {
	var out []Entry
	for _, n := range Names() {
		a, err := Lookup(n)
		if err != nil {
			// Every embedded config parses (catalog_test.go checks it);
			// list a broken one rather than hide it.
			out = append(out, Entry{Name: n, Repo: catalogRepos[n], Description: err.Error()})
			continue
		}
		out = append(out, Entry{
			Name:        n,
			Repo:        catalogRepos[n],
			Family:      a.Family,
			Params:      a.ParamCount(),
			Description: a.Describe(),
		})
	}
	return out
}

// LoadSnapshot reads a Hugging Face snapshot directory (what
// huggingface_hub's snapshot_download or save_pretrained writes): its
// config.json, named by the directory.
func LoadSnapshot(dir string) (*Arch, error) {
	path := filepath.Join(dir, "config.json")
	data, err := boundedio.ReadFile(path, boundedio.SmallFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: no config.json in this directory (a Hugging Face snapshot directory holds the model's config.json)", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	a, err := ParseHFConfig(data, path)
	if err != nil {
		return nil, err
	}
	a.Name = filepath.Clean(dir)
	return a, nil
}
