package hw

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/agnivade/levenshtein"
	"sigs.k8s.io/yaml"

	"github.com/memplan/memplan/units"
)

//go:embed gpus.yaml
var catalogYAML []byte

// ErrUnknownGPU is wrapped by Lookup when no entry or alias matches.
var ErrUnknownGPU = errors.New("unknown GPU")

// Link is the host link of a GPU (PCIe).
type Link struct {
	Kind  string // "pcie" or "nvlink-c2c"
	Gen   int    // PCIe generation
	Lanes int    // link width
	// PerDirection is the bandwidth in one direction, bytes/s, from the
	// PCI-SIG line rate with 128b/130b encoding (Gen3 x16 ≈ 15.75 GB/s,
	// Gen4 x16 ≈ 31.5 GB/s, Gen5 x16 ≈ 63.0 GB/s). It is a wire rate: real
	// pinned-memory copies achieve less.
	PerDirection float64
}

// String formats the link as "PCIe Gen4 x16 (31.5 GB/s/dir)" or
// "NVLink-C2C (450.0 GB/s/dir)".
func (l Link) String() string {
	if l.Kind == "nvlink-c2c" {
		return fmt.Sprintf("NVLink-C2C (%.1f GB/s/dir)", l.PerDirection/1e9)
	}
	return fmt.Sprintf("PCIe Gen%d x%d (%.1f GB/s/dir)", l.Gen, l.Lanes, l.PerDirection/1e9)
}

// GPU is one catalog entry. Throughputs are dense peaks (no sparsity) in
// FLOP/s; a zero throughput means the architecture has no hardware support
// for that type. Bandwidths are bytes/s.
type GPU struct {
	Name    string
	Vendor  string
	Aliases []string
	// ComputeCapability is the CUDA compute capability, e.g. "9.0".
	ComputeCapability string

	// Memory is the marketing capacity as printed on the datasheet.
	Memory units.Bytes
	// TotalMemory is cudaDeviceProp.totalGlobalMem (what
	// torch.cuda.get_device_properties reports as total_memory).
	TotalMemory       units.Bytes
	TotalMemorySource string

	FP32 float64 // non-tensor FP32
	TF32 float64 // tensor-core TF32
	BF16 float64 // tensor-core BF16, FP32 accumulate
	FP16 float64 // tensor-core FP16, FP32 accumulate
	FP8  float64 // tensor-core FP8

	MemBandwidth float64 // DRAM bytes/s
	HostLink     Link
	// NVLink is the per-GPU NVLink bandwidth, both directions summed, as
	// NVIDIA prints it; 0 when the part has none.
	NVLink float64
	// Node is the server the catalog's figures assume this GPU sits in
	// (GPUs per node and each GPU's inter-node network); nil when the
	// catalog gives none (PCIe cards sold into many different servers).
	Node *Node
	// MIG is set for a Multi-Instance GPU profile (mig.go), nil for a whole
	// GPU.
	MIG *MIG

	Source string
}

// Node is a multi-GPU server: GPUs share its intra-node link (NVLink);
// each GPU has its own network adapter to the other nodes (the
// rail-optimised DGX/HGX layout), NetworkPerDirection bytes/s per GPU and
// per direction, a wire rate.
type Node struct {
	GPUs                int
	NetworkPerDirection float64
	Source              string
}

var ccRE = regexp.MustCompile(`^[0-9]{1,2}\.[0-9]$`)

// CublasWorkspace is the workspace PyTorch 2.x's cuBLAS handle takes from
// the caching allocator per handle and stream by default: 32 MiB on
// compute capability 9.0 (Hopper), else 4096 KiB × 2 + 16 KiB × 8 =
// 8,519,680 bytes (aten/src/ATen/cuda/CublasHandlePool.cpp
// getChosenWorkspaceSize, PyTorch #91564, since 2.0).
func (g *GPU) CublasWorkspace() units.Bytes {
	if g.ComputeCapability == "9.0" {
		return 32 << 20
	}
	return 4096<<10*2 + 16<<10*8
}

// NVLinkPerDirection is half of the bidirectional NVLink figure.
func (g *GPU) NVLinkPerDirection() float64 { return g.NVLink / 2 }

// Capacity is the memory a process can allocate on the device: the usable
// total_memory, not the marketing figure.
func (g *GPU) Capacity() units.Bytes { return g.TotalMemory }

// PeakFLOPs is the dense peak for matmuls in dtype, FLOP/s. F32 returns the
// non-tensor FP32 rate (use g.TF32 when TF32 matmuls are enabled). It is 0 for
// types the hardware has no fast path for (BF16 on Volta/Turing, FP8 before
// Ada/Hopper, integer types).
func (g *GPU) PeakFLOPs(dtype units.DType) float64 {
	switch dtype {
	case units.F32:
		return g.FP32
	case units.BF16:
		return g.BF16
	case units.F16:
		return g.FP16
	case units.FP8:
		return g.FP8
	}
	return 0
}

// rawGPU mirrors one YAML entry.
type rawGPU struct {
	Name              string   `json:"name"`
	Vendor            string   `json:"vendor"`
	ComputeCapability string   `json:"compute_capability"`
	Aliases           []string `json:"aliases"`
	Memory            string   `json:"memory"`
	TotalMemory       string   `json:"total_memory"`
	TotalMemorySource string   `json:"total_memory_source"`
	FP32              float64  `json:"fp32_tflops"`
	TF32              float64  `json:"tf32_tflops"`
	BF16              float64  `json:"bf16_tflops"`
	FP16              float64  `json:"fp16_tflops"`
	FP8               float64  `json:"fp8_tflops"`
	MemBandwidthGBs   float64  `json:"mem_bandwidth_gbs"`
	HostLink          struct {
		Kind  string  `json:"kind"`
		Gen   int     `json:"gen"`
		Lanes int     `json:"lanes"`
		GBs   float64 `json:"gbs"`
	} `json:"host_link"`
	NVLinkGBs float64 `json:"nvlink_gbs"`
	Node      *struct {
		GPUs        int     `json:"gpus"`
		NetworkGbps float64 `json:"network_gbps"`
		Source      string  `json:"source"`
	} `json:"node"`
	Source string     `json:"source"`
	MIG    *rawMIGSet `json:"mig"`
}

// pcieLaneGTs is the per-lane line rate in GT/s by generation (PCI-SIG).
var pcieLaneGTs = map[int]float64{3: 8, 4: 16, 5: 32}

func pciePerDirection(gen, lanes int) (float64, bool) {
	gts, ok := pcieLaneGTs[gen]
	if !ok || lanes <= 0 {
		return 0, false
	}
	// Gen3+ use 128b/130b encoding; one transfer carries one bit per lane.
	return gts * 1e9 * float64(lanes) * 128 / 130 / 8, true
}

func parseCatalog(data []byte) ([]GPU, error) {
	var raws []rawGPU
	if err := yaml.UnmarshalStrict(data, &raws); err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	if len(raws) == 0 {
		return nil, errors.New("catalog: no entries")
	}
	gpus := make([]GPU, 0, len(raws))
	for i, r := range raws {
		g, err := r.toGPU()
		if err != nil {
			return nil, fmt.Errorf("catalog entry %d (%q): %w", i, r.Name, err)
		}
		slices, err := migSlices(g, r.MIG)
		if err != nil {
			return nil, fmt.Errorf("catalog entry %d (%q): %w", i, r.Name, err)
		}
		gpus = append(append(gpus, g), slices...)
	}
	return gpus, nil
}

func (r rawGPU) toGPU() (GPU, error) {
	if r.Name == "" || r.Name != normalize(r.Name) {
		return GPU{}, fmt.Errorf("name must be non-empty, lower-case, dash-separated")
	}
	if r.Vendor == "nvidia" && !ccRE.MatchString(r.ComputeCapability) {
		return GPU{}, fmt.Errorf("%s: compute_capability %q is not major.minor", r.Name, r.ComputeCapability)
	}
	if r.Vendor == "" || r.Source == "" || r.TotalMemorySource == "" {
		return GPU{}, fmt.Errorf("vendor, source and total_memory_source are required")
	}
	mem, err := units.ParseBytes(r.Memory)
	if err != nil {
		return GPU{}, fmt.Errorf("memory: %w", err)
	}
	total, err := units.ParseBytes(r.TotalMemory)
	if err != nil {
		return GPU{}, fmt.Errorf("total_memory: %w", err)
	}
	for _, f := range []struct {
		name     string
		v        float64
		required bool
	}{
		{"fp32_tflops", r.FP32, true},
		{"fp16_tflops", r.FP16, true},
		{"mem_bandwidth_gbs", r.MemBandwidthGBs, true},
		{"tf32_tflops", r.TF32, false},
		{"bf16_tflops", r.BF16, false},
		{"fp8_tflops", r.FP8, false},
		{"nvlink_gbs", r.NVLinkGBs, false},
	} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 || (f.required && f.v == 0) {
			return GPU{}, fmt.Errorf("%s = %v: must be %s", f.name, f.v, map[bool]string{true: "positive", false: "non-negative"}[f.required])
		}
	}
	link, err := r.hostLink()
	if err != nil {
		return GPU{}, err
	}
	node, err := r.node()
	if err != nil {
		return GPU{}, err
	}
	const tera, giga = 1e12, 1e9
	return GPU{
		Name:              r.Name,
		Vendor:            r.Vendor,
		ComputeCapability: r.ComputeCapability,
		Aliases:           r.Aliases,
		Memory:            mem,
		TotalMemory:       total,
		TotalMemorySource: r.TotalMemorySource,
		FP32:              r.FP32 * tera,
		TF32:              r.TF32 * tera,
		BF16:              r.BF16 * tera,
		FP16:              r.FP16 * tera,
		FP8:               r.FP8 * tera,
		MemBandwidth:      r.MemBandwidthGBs * giga,
		HostLink:          link,
		NVLink:            r.NVLinkGBs * giga,
		Node:              node,
		Source:            r.Source,
	}, nil
}

// node reads node: GPUs per node and each GPU's network in Gb/s per
// direction (as adapters are sold: "400Gb/s InfiniBand"), with its source.
func (r rawGPU) node() (*Node, error) {
	n := r.Node
	if n == nil {
		return nil, nil
	}
	if n.GPUs < 1 || math.IsNaN(n.NetworkGbps) || math.IsInf(n.NetworkGbps, 0) || n.NetworkGbps <= 0 || n.Source == "" {
		return nil, fmt.Errorf("node: gpus >= 1, network_gbps > 0 and source are required")
	}
	return &Node{GPUs: n.GPUs, NetworkPerDirection: n.NetworkGbps * 1e9 / 8, Source: n.Source}, nil
}

// hostLink reads host_link: a PCIe generation and width, or an NVLink-C2C
// link of a superchip (its bidirectional GB/s, half each way).
func (r rawGPU) hostLink() (Link, error) {
	h := r.HostLink
	switch h.Kind {
	case "", "pcie":
		per, ok := pciePerDirection(h.Gen, h.Lanes)
		if !ok {
			return Link{}, fmt.Errorf("host_link: unsupported PCIe gen %d x%d", h.Gen, h.Lanes)
		}
		return Link{Kind: "pcie", Gen: h.Gen, Lanes: h.Lanes, PerDirection: per}, nil
	case "nvlink-c2c":
		if !(h.GBs > 0) || math.IsInf(h.GBs, 0) || h.Gen != 0 || h.Lanes != 0 {
			return Link{}, fmt.Errorf("host_link: nvlink-c2c takes gbs > 0 and no gen or lanes")
		}
		return Link{Kind: "nvlink-c2c", PerDirection: h.GBs * 1e9 / 2}, nil
	}
	return Link{}, fmt.Errorf("host_link: unknown kind %q (pcie or nvlink-c2c)", h.Kind)
}

type catalog struct {
	gpus  []GPU          // sorted as All returns them
	index map[string]int // normalized name or alias -> gpus index
}

var (
	loadOnce sync.Once
	loaded   catalog
	loadErr  error
)

func load() (catalog, error) {
	loadOnce.Do(func() { loaded, loadErr = buildCatalog(catalogYAML) })
	return loaded, loadErr
}

func buildCatalog(data []byte) (catalog, error) {
	gpus, err := parseCatalog(data)
	if err != nil {
		return catalog{}, err
	}
	sort.SliceStable(gpus, func(i, j int) bool {
		if gpus[i].Capacity() != gpus[j].Capacity() {
			return gpus[i].Capacity() < gpus[j].Capacity()
		}
		return gpus[i].Name < gpus[j].Name
	})
	c := catalog{gpus: gpus, index: map[string]int{}}
	for i, g := range gpus {
		for _, key := range append([]string{g.Name}, g.Aliases...) {
			k := normalize(key)
			if prev, dup := c.index[k]; dup {
				return catalog{}, fmt.Errorf("catalog: %q names both %s and %s", key, gpus[prev].Name, g.Name)
			}
			c.index[k] = i
		}
	}
	return c, nil
}

// normalize lower-cases s and turns spaces and underscores into dashes, so
// that torch device names ("NVIDIA H100 80GB HBM3") match aliases.
func normalize(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.NewReplacer(" ", "-", "_", "-").Replace(s)
	for strings.Contains(s, "--") {
		s = strings.ReplaceAll(s, "--", "-")
	}
	return s
}

// Lookup finds a GPU by name or alias, ignoring case; spaces and underscores
// count as dashes. The result is a copy the caller may modify. An unknown
// name yields an error wrapping ErrUnknownGPU that names the three closest
// catalog entries.
func Lookup(name string) (*GPU, error) {
	c, err := load()
	if err != nil {
		return nil, err
	}
	k := normalize(name)
	if i, ok := c.index[k]; ok {
		g := c.gpus[i]
		g.Aliases = append([]string(nil), g.Aliases...)
		if g.Node != nil {
			n := *g.Node
			g.Node = &n
		}
		if g.MIG != nil {
			m := *g.MIG
			g.MIG = &m
		}
		return &g, nil
	}
	return nil, fmt.Errorf("%w %q; closest: %s", ErrUnknownGPU, name, strings.Join(c.closest(k, 3), ", "))
}

// Suggest is up to n catalog GPU names nearest to name (by name or alias,
// in edit distance), for a message about a name the catalog lacks.
func Suggest(name string, n int) []string {
	c, err := load()
	if err != nil {
		return nil
	}
	return c.closest(normalize(name), n)
}

// closest returns up to n canonical names whose name or alias is nearest to k
// in edit distance.
func (c catalog) closest(k string, n int) []string {
	best := map[string]int{}
	for key, i := range c.index {
		d := levenshtein.ComputeDistance(k, key)
		name := c.gpus[i].Name
		if old, ok := best[name]; !ok || d < old {
			best[name] = d
		}
	}
	names := make([]string, 0, len(best))
	for name := range best {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if best[names[i]] != best[names[j]] {
			return best[names[i]] < best[names[j]]
		}
		return names[i] < names[j]
	})
	if len(names) > n {
		names = names[:n]
	}
	return names
}

// All returns a copy of the catalog sorted by Capacity, then name.
func All() []GPU {
	c, err := load()
	if err != nil {
		// The embedded catalog is validated by the package tests; a failure
		// here is a build defect, not a runtime condition.
		panic(err)
	}
	out := make([]GPU, len(c.gpus))
	for i, g := range c.gpus {
		g.Aliases = append([]string(nil), g.Aliases...)
		if g.Node != nil {
			n := *g.Node
			g.Node = &n
		}
		if g.MIG != nil {
			m := *g.MIG
			g.MIG = &m
		}
		out[i] = g
	}
	return out
}
