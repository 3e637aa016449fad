package hw

import (
	"math"
	"strings"
	"testing"

	"github.com/memplan/memplan/units"
)

// MIG profiles are catalog entries <gpu>-mig-<profile> (and under every
// alias of the GPU): the instance's memory as nvidia-smi mig -lgip prints
// it, peaks scaled by the instance's SMs, bandwidth by its memory slices,
// no NVLink and no node.
func TestMIGProfiles(t *testing.T) {
	whole, err := Lookup("h100-sxm")
	if err != nil {
		t.Fatal(err)
	}
	g, err := Lookup("h100-80gb-mig-3g.40gb")
	if err != nil {
		t.Fatal(err)
	}
	if g.Name != "h100-sxm-mig-3g.40gb" || g.MIG == nil || g.MIG.Parent != "h100-sxm" || g.MIG.SMs != 60 || g.MIG.ParentSMs != 132 {
		t.Fatalf("got %+v (MIG %+v)", g, g.MIG)
	}
	// lgip: MIG 3g.40gb 39.50 GiB, 60 SMs; the MIG User Guide: 4/8 of the memory.
	if want := units.Bytes(39.5 * (1 << 30)); g.Capacity() != want {
		t.Errorf("capacity %d, want %d (39.50 GiB)", g.Capacity(), want)
	}
	if got, want := g.BF16, whole.BF16*60/132; math.Abs(got-want) > 1e-9*want {
		t.Errorf("BF16 %g, want %g (60 of 132 SMs)", got, want)
	}
	if got, want := g.MemBandwidth, whole.MemBandwidth/2; got != want {
		t.Errorf("bandwidth %g, want %g (4/8 of the memory)", got, want)
	}
	if g.NVLink != 0 || g.Node != nil || g.Memory != 40e9 || !strings.Contains(g.Source, "Multi-Instance GPU User Guide") {
		t.Errorf("NVLink %g node %v memory %d source %q", g.NVLink, g.Node, g.Memory, g.Source)
	}
	for _, c := range []struct {
		name string
		gib  float64
		sms  int
	}{
		{"a100-40gb-mig-1g.5gb", 4.75, 14},
		{"a100-mig-3g.40gb", 39.25, 42},
		{"h100-mig-1g.10gb", 9.75, 16},
		{"h100-sxm-mig-7g.80gb", 79.25, 132},
		{"h200-mig-1g.18gb", 16, 16},
	} {
		g, err := Lookup(c.name)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if g.Capacity() != units.Bytes(c.gib*(1<<30)) || g.MIG.SMs != c.sms {
			t.Errorf("%s: %v, %d SMs; want %g GiB, %d", c.name, g.Capacity(), g.MIG.SMs, c.gib, c.sms)
		}
	}
	n := 0
	for _, g := range All() {
		if g.MIG == nil {
			continue
		}
		n++
		p, err := Lookup(g.MIG.Parent)
		if err != nil {
			t.Fatal(err)
		}
		if g.Capacity() > p.Capacity()*101/100 || g.BF16 > p.BF16 || g.MemBandwidth > p.MemBandwidth || g.ComputeCapability != p.ComputeCapability {
			t.Errorf("%s exceeds %s", g.Name, p.Name)
		}
	}
	if n != 17 {
		t.Errorf("%d MIG profiles, want 17 (A100 40GB 5, A100 80GB 5, H100 6, H200 1)", n)
	}
}

// A bad mig block is refused naming the field.
func TestMIGBadBlocks(t *testing.T) {
	entry := func(mig string) []byte {
		return []byte(`
- name: x100
  vendor: nvidia
  compute_capability: "9.0"
  memory: 80GB
  total_memory: 80GiB
  total_memory_source: s
  fp32_tflops: 1
  fp16_tflops: 1
  mem_bandwidth_gbs: 1
  host_link: {gen: 4, lanes: 16}
  source: s
  mig:
    sm_count: 100
    sm_count_source: s
    fraction_source: s
    memory_source: s
    profiles:
` + mig)
	}
	good := "      - {profile: 1g.10gb, sms: 14, memory_fraction: \"1/8\", total_memory: 9.5GiB}\n"
	if gpus, err := parseCatalog(entry(good)); err != nil || len(gpus) != 2 || gpus[1].Name != "x100-mig-1g.10gb" {
		t.Fatalf("good block: %v %v", gpus, err)
	}
	for _, c := range []struct{ mig, want string }{
		{"      - {profile: 1g.10g, sms: 14, memory_fraction: \"1/8\", total_memory: 9.5GiB}\n", "profile is not <n>g.<m>gb"},
		{"      - {profile: 1g.10gb, sms: 101, memory_fraction: \"1/8\", total_memory: 9.5GiB}\n", "sms 101 must be in [1, sm_count 100]"},
		{"      - {profile: 1g.10gb, sms: 14, memory_fraction: \"9/8\", total_memory: 9.5GiB}\n", "memory_fraction"},
		{"      - {profile: 1g.10gb, sms: 14, memory_fraction: \"1/8\", total_memory: 90GiB}\n", "at most the whole GPU's"},
		{"      - {profile: 1g.10gb, sms: 14, memory_fraction: \"1/8\", total_memory: lots}\n", "total_memory"},
		{"      - {profile: 1g.10gb, sms: 14, memory_fraction: \"1/8\", total_memory: 9.5GiB, extra: 1}\n", "unknown field"},
		{"", "no profiles"},
	} {
		_, err := parseCatalog(entry(c.mig))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want one line with %q", c.mig, err, c.want)
		}
	}
}
