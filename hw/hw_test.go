package hw

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/memplan/memplan/units"
)

func TestCatalogParses(t *testing.T) {
	c, err := buildCatalog(catalogYAML)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.gpus) < 15 {
		t.Fatalf("catalog has %d entries, want at least 15", len(c.gpus))
	}
}

func TestEntriesComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, g := range All() {
		if seen[g.Name] {
			t.Errorf("duplicate name %s", g.Name)
		}
		seen[g.Name] = true
		if g.Vendor == "" || g.Source == "" || g.TotalMemorySource == "" {
			t.Errorf("%s: missing vendor/source/total_memory_source", g.Name)
		}
		for name, v := range map[string]float64{
			"memory": float64(g.Memory), "total_memory": float64(g.TotalMemory),
			"fp32": g.FP32, "fp16": g.FP16, "bandwidth": g.MemBandwidth,
			"host link": g.HostLink.PerDirection,
		} {
			if !(v > 0) {
				t.Errorf("%s: %s = %v, want > 0", g.Name, name, v)
			}
		}
		// Optional throughputs are absent (0) only where the architecture
		// lacks them; when present, tensor throughputs exceed plain FP32
		// except TF32 on GeForce parts, where it equals FP32.
		for name, v := range map[string]float64{"tf32": g.TF32, "bf16": g.BF16, "fp8": g.FP8, "nvlink": g.NVLink} {
			if v < 0 {
				t.Errorf("%s: %s = %v, want >= 0", g.Name, name, v)
			}
		}
		if g.FP16 <= g.FP32 || (g.BF16 != 0 && g.BF16 <= g.FP32) || (g.TF32 != 0 && g.TF32 < g.FP32) {
			t.Errorf("%s: tensor throughput not above FP32", g.Name)
		}
		if g.FP8 != 0 && g.FP8 <= g.BF16 {
			t.Errorf("%s: fp8 %v <= bf16 %v", g.Name, g.FP8, g.BF16)
		}
		// Usable memory is within 10% of the datasheet figure.
		if r := float64(g.TotalMemory) / float64(g.Memory); r < 0.9 || r > 1.1 {
			t.Errorf("%s: total_memory/memory = %.3f", g.Name, r)
		}
	}
}

func TestAllSorted(t *testing.T) {
	all := All()
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if a.Capacity() > b.Capacity() || (a.Capacity() == b.Capacity() && a.Name > b.Name) {
			t.Errorf("All not sorted at %d: %s, %s", i, a.Name, b.Name)
		}
	}
	all[0].Name = "mutated"
	if All()[0].Name == "mutated" {
		t.Error("All returned shared storage")
	}
}

func TestAliases(t *testing.T) {
	for in, want := range map[string]string{
		"h100":                  "h100-sxm",
		"H100":                  "h100-sxm",
		"a100":                  "a100-80gb",
		"4090":                  "rtx-4090",
		"3090":                  "rtx-3090",
		"NVIDIA H100 80GB HBM3": "h100-sxm",
		"NVIDIA A100-SXM4-40GB": "a100-40gb",
		"nvidia_a100_80gb_pcie": "a100-80gb-pcie",
		" L40S ":                "l40s",
		"rtx-a6000":             "rtx-a6000",
	} {
		g, err := Lookup(in)
		if err != nil {
			t.Errorf("Lookup(%q): %v", in, err)
			continue
		}
		if g.Name != want {
			t.Errorf("Lookup(%q) = %s, want %s", in, g.Name, want)
		}
	}
	for _, g := range All() {
		for _, a := range g.Aliases {
			got, err := Lookup(a)
			if err != nil || got.Name != g.Name {
				t.Errorf("alias %q of %s: got %v, %v", a, g.Name, got, err)
			}
		}
	}
}

func TestUnknownSuggests(t *testing.T) {
	_, err := Lookup("h1000")
	if !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("err = %v, want ErrUnknownGPU", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "") || strings.Contains(msg, "\n") {
		t.Errorf("error %q: want one line prefixed hw:", msg)
	}
	if !strings.Contains(msg, "h100-sxm") || strings.Count(msg, ",") != 2 {
		t.Errorf("error %q: want three suggestions including h100-sxm", msg)
	}
	_, err = Lookup("rtx-4080")
	if err == nil || !strings.Contains(err.Error(), "rtx-4090") {
		t.Errorf("Lookup(rtx-4080) error %v: want rtx-4090 suggested", err)
	}
}

func TestDatasheetFigures(t *testing.T) {
	get := func(n string) *GPU {
		g, err := Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	// NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5): BF16
	// dense 989.4 TFLOPS (the datasheet's 1,979 TFLOPS is with sparsity).
	if got := get("h100-sxm").PeakFLOPs(units.BF16); got != 989.4e12 {
		t.Errorf("H100 SXM bf16 = %v, want 989.4e12", got)
	}
	// NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity).
	if got := get("a100").PeakFLOPs(units.BF16); got != 312e12 {
		t.Errorf("A100 bf16 = %v, want 312e12", got)
	}
	// NVIDIA H200 datasheet: 141GB HBM3e at 4.8 TB/s.
	h200 := get("h200")
	if h200.Memory != 141*units.GB || h200.MemBandwidth != 4.8e12 {
		t.Errorf("H200 memory %d B at %v B/s, want 141 GB at 4.8e12", h200.Memory, h200.MemBandwidth)
	}
	// Usable capacity is total_memory, not the datasheet figure:
	// torch reports 85029158912 B on an H100 80GB HBM3.
	if got := get("h100").Capacity(); got != 85029158912 {
		t.Errorf("H100 capacity = %d", got)
	}
	// NVLink: 900 GB/s bidirectional = 450 GB/s per direction (H100 datasheet).
	if got := get("h100").NVLinkPerDirection(); got != 450e9 {
		t.Errorf("H100 NVLink per direction = %v", got)
	}
	// PCIe Gen4 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction.
	if got := get("a100").HostLink.PerDirection; got < 31.5e9 || got > 31.51e9 {
		t.Errorf("A100 PCIe per direction = %v", got)
	}
	// Turing has no BF16 tensor cores.
	if got := get("t4").PeakFLOPs(units.BF16); got != 0 {
		t.Errorf("T4 bf16 = %v, want 0", got)
	}
	if got := get("t4").PeakFLOPs(units.I64); got != 0 {
		t.Errorf("T4 int64 = %v, want 0", got)
	}
	// NVIDIA Blackwell technical brief pp. 19-20 as cited in pytorch/ao
	// roofline_utils.py @ 0598012907d6: BF16 2.25, FP8 4.5 PFLOPS dense,
	// 8.0 TB/s; FP32 80 TFLOPS (HGX B200, 1,000 W); NVLink 1.8 TB/s per GPU.
	if b := get("b200"); b.PeakFLOPs(units.FP8) != 4500e12 || b.PeakFLOPs(units.BF16) != 2250e12 || b.PeakFLOPs(units.F32) != 80e12 ||
		b.MemBandwidth != 8e12 || b.NVLinkPerDirection() != 900e9 || b.Memory != 180*units.GB {
		t.Errorf("B200: fp8 %v, bf16 %v, fp32 %v, bandwidth %v, nvlink/dir %v, memory %v", b.PeakFLOPs(units.FP8),
			b.PeakFLOPs(units.BF16), b.PeakFLOPs(units.F32), b.MemBandwidth, b.NVLinkPerDirection(), b.Memory)
	}
	// ROCm "AMD Instinct MI300 microarchitecture" FLOPs/clock/CU x 304 CUs x
	// 2.1 GHz: FP16/BF16 matrix 2048 -> 1,307.4 TFLOPS, vector FP32 256 ->
	// 163.4; 5.3 TB/s (MI300X data sheet); rocm-smi's 205822885888 B total.
	if m := get("mi300x"); m.PeakFLOPs(units.BF16) != 1307.4e12 || m.PeakFLOPs(units.F32) != 163.4e12 ||
		m.MemBandwidth != 5.3e12 || m.Capacity() != 205822885888 {
		t.Errorf("MI300X: bf16 %v, fp32 %v, bandwidth %v, capacity %d", m.PeakFLOPs(units.BF16), m.PeakFLOPs(units.F32), m.MemBandwidth, m.Capacity())
	}
	// The derivation itself: FLOPs/clock/CU x CUs x clock, rounded to 0.1 TFLOPS.
	for _, c := range []struct {
		dt       units.DType
		perClkCU float64
	}{{units.F32, 256}, {units.BF16, 2048}, {units.FP8, 4096}} {
		want := math.Round(c.perClkCU*304*2.1e9/1e11) * 1e11
		if got := get("mi300x").PeakFLOPs(c.dt); math.Abs(got-want) > 1e6 {
			t.Errorf("MI300X %v: %v, derived %v", c.dt, got, want)
		}
	}
	// GH200: NVLink-C2C 900 GB/s both ways, 450 GB/s each way to the host.
	if g := get("gh200"); g.HostLink.Kind != "nvlink-c2c" || g.HostLink.PerDirection != 450e9 || g.HostLink.String() != "NVLink-C2C (450.0 GB/s/dir)" {
		t.Errorf("GH200 host link %+v %s", g.HostLink, g.HostLink)
	}
	// Torch's printed capacities (two decimals of GiB).
	for name, gib := range map[string]float64{"a10g": 22.19, "b200": 178.35} {
		if got := get(name).Capacity().GiBf(); math.Abs(got-gib) > 1e-9 {
			t.Errorf("%s capacity %.4f GiB, want %.2f", name, got, gib)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"empty":         `[]`,
		"unknown field": "- {name: x, vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {gen: 4, lanes: 16}, source: s, bogus: 1}",
		"zero fp32":     "- {name: x, vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {gen: 4, lanes: 16}, source: s}",
		"bad gen":       "- {name: x, vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {gen: 2, lanes: 16}, source: s}",
		"bad memory":    "- {name: x, vendor: v, memory: lots, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {gen: 4, lanes: 16}, source: s}",
		"no source":     "- {name: x, vendor: v, memory: 1GB, total_memory: 1GB, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {gen: 4, lanes: 16}}",
		"c2c with gen":  "- {name: x, vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {kind: nvlink-c2c, gen: 5, gbs: 900}, source: s}",
		"c2c no gbs":    "- {name: x, vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {kind: nvlink-c2c}, source: s}",
		"bad link kind": "- {name: x, vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {kind: infiniband, gbs: 50}, source: s}",
		"dup alias":     "- {name: x, aliases: [y], vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {gen: 4, lanes: 16}, source: s}\n- {name: y, vendor: v, memory: 1GB, total_memory: 1GB, total_memory_source: s, fp32_tflops: 1, fp16_tflops: 2, mem_bandwidth_gbs: 1, host_link: {gen: 4, lanes: 16}, source: s}",
	} {
		if _, err := buildCatalog([]byte(doc)); err == nil || !strings.HasPrefix(err.Error(), "") {
			t.Errorf("%s: err = %v, want hw: error", name, err)
		}
	}
}
