package hw

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/memplan/memplan/units"
)

// MIG is one Multi-Instance GPU profile of a catalog GPU: a GPU instance
// with SMs of the whole GPU's ParentSMs streaming multiprocessors and
// MemoryFraction of its memory slices (with the memory controllers and L2
// that come with them), as `nvidia-smi mig -lgip` and NVIDIA's MIG User
// Guide ("Supported MIG Profiles", Fraction of Memory) give them.
type MIG struct {
	Parent  string // the whole GPU's catalog name
	Profile string // e.g. "3g.40gb"
	// SMs of ParentSMs scale the compute peaks; MemoryFraction scales the
	// memory bandwidth.
	SMs, ParentSMs int
	MemoryFraction float64
}

// SMFraction is the share of the whole GPU's SMs the instance holds.
func (m *MIG) SMFraction() float64 { return float64(m.SMs) / float64(m.ParentSMs) }

// rawMIGSet is a catalog entry's mig block.
type rawMIGSet struct {
	SMCount        int      `json:"sm_count"`
	SMCountSource  string   `json:"sm_count_source"`
	FractionSource string   `json:"fraction_source"`
	MemorySource   string   `json:"memory_source"`
	Profiles       []rawMIG `json:"profiles"`
}

// rawMIG is one profile: its SMs and instance memory (lgip's SM and Memory
// columns) and its fraction of the memory ("n/8").
type rawMIG struct {
	Profile        string `json:"profile"`
	SMs            int    `json:"sms"`
	MemoryFraction string `json:"memory_fraction"`
	TotalMemory    string `json:"total_memory"`
}

var (
	migProfileRE = regexp.MustCompile(`^([1-7])g\.([0-9]{1,3})gb$`)
	fractionRE   = regexp.MustCompile(`^([1-8])/([1-8])$`)
)

// fraction reads "n/d" with 0 < n <= d <= 8.
func fraction(s string) (float64, error) {
	m := fractionRE.FindStringSubmatch(s)
	if m == nil || m[1] > m[2] {
		return 0, fmt.Errorf("%q is not a fraction n/d with 0 < n <= d <= 8", s)
	}
	return float64(m[1][0]-'0') / float64(m[2][0]-'0'), nil
}

// check verifies the block's sources and SM count.
func (set *rawMIGSet) check() error {
	if set.SMCount < 1 || set.SMCount > 1024 {
		return fmt.Errorf("mig: sm_count %d must be in [1, 1024]", set.SMCount)
	}
	if set.SMCountSource == "" || set.FractionSource == "" || set.MemorySource == "" {
		return fmt.Errorf("mig: sm_count_source, fraction_source and memory_source are required")
	}
	if len(set.Profiles) == 0 {
		return fmt.Errorf("mig: no profiles")
	}
	return nil
}

// migSlices derives the GPU instances of parent's MIG profiles: named
// "<parent>-mig-<profile>" (and "<alias>-mig-<profile>" for each alias),
// with the instance's memory, the compute peaks scaled by its share of the
// SMs, the memory bandwidth by its share of the memory; no NVLink and no
// node (a MIG instance has no peer-to-peer access; one process sees one
// instance); the host link is the whole GPU's, quoted whole.
func migSlices(parent GPU, set *rawMIGSet) ([]GPU, error) {
	if set == nil {
		return nil, nil
	}
	if err := set.check(); err != nil {
		return nil, err
	}
	out := make([]GPU, 0, len(set.Profiles))
	for _, r := range set.Profiles {
		g, err := migSlice(parent, set, r)
		if err != nil {
			return nil, fmt.Errorf("mig %s: %w", r.Profile, err)
		}
		out = append(out, g)
	}
	return out, nil
}

// migSlice is one profile's instance of parent.
func migSlice(parent GPU, set *rawMIGSet, r rawMIG) (GPU, error) {
	m := migProfileRE.FindStringSubmatch(r.Profile)
	if m == nil {
		return GPU{}, fmt.Errorf("profile is not <n>g.<m>gb")
	}
	if r.SMs < 1 || r.SMs > set.SMCount {
		return GPU{}, fmt.Errorf("sms %d must be in [1, sm_count %d]", r.SMs, set.SMCount)
	}
	memFrac, err := fraction(r.MemoryFraction)
	if err != nil {
		return GPU{}, fmt.Errorf("memory_fraction: %w", err)
	}
	total, err := units.ParseBytes(r.TotalMemory)
	if err != nil {
		return GPU{}, fmt.Errorf("total_memory: %w", err)
	}
	if total <= 0 || float64(total) > 1.01*float64(parent.TotalMemory) {
		return GPU{}, fmt.Errorf("total_memory %s must be positive and at most the whole GPU's", r.TotalMemory)
	}
	gb, _ := strconv.Atoi(m[2])
	mig := &MIG{Parent: parent.Name, Profile: r.Profile, SMs: r.SMs, ParentSMs: set.SMCount, MemoryFraction: memFrac}
	sm := mig.SMFraction()
	g := parent
	g.Name = parent.Name + "-mig-" + r.Profile
	g.Aliases = nil
	for _, a := range parent.Aliases {
		g.Aliases = append(g.Aliases, a+"-mig-"+r.Profile)
	}
	g.Memory = units.Bytes(gb) * units.Bytes(1e9)
	g.TotalMemory = total
	g.TotalMemorySource = fmt.Sprintf("MIG %s instance memory %s: %s", r.Profile, r.TotalMemory, set.MemorySource)
	g.FP32, g.TF32, g.BF16, g.FP16, g.FP8 = parent.FP32*sm, parent.TF32*sm, parent.BF16*sm, parent.FP16*sm, parent.FP8*sm
	g.MemBandwidth = parent.MemBandwidth * memFrac
	g.NVLink, g.Node, g.MIG = 0, nil, mig
	g.Source = fmt.Sprintf("MIG %s of %s: %d of %d SMs (%s), %s of the memory (%s); whole GPU: %s",
		r.Profile, parent.Name, r.SMs, set.SMCount, set.SMCountSource, r.MemoryFraction, set.FractionSource, parent.Source)
	return g, nil
}
