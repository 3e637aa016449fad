package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// MIG profiles: listed by `memplan gpus -o json` with their place in the
// GPU and their source, and usable as --gpu: a plan on a slice is checked
// against the instance's memory and priced on its share of the SMs and of
// the memory bandwidth.
func TestMIGListingAndPlan(t *testing.T) {
	code, out, errs := run("gpus", "-o", "json")
	if code != 0 {
		t.Fatalf("gpus -o json: exit %d: %s", code, errs)
	}
	var g struct {
		GPUs []struct {
			Name   string
			Source string
			MIG    *struct {
				Parent, Profile string
				SMs             int     `json:"sms"`
				ParentSMs       int     `json:"parent_sms"`
				MemoryFraction  float64 `json:"memory_fraction"`
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatal(err)
	}
	migs := 0
	for _, r := range g.GPUs {
		if r.MIG == nil {
			continue
		}
		migs++
		if r.Name != r.MIG.Parent+"-mig-"+r.MIG.Profile || r.MIG.SMs > r.MIG.ParentSMs || !strings.Contains(r.Source, "Multi-Instance GPU User Guide") {
			t.Errorf("%+v %+v", r, *r.MIG)
		}
	}
	if migs == 0 {
		t.Fatal("gpus -o json lists no MIG profile")
	}
	plan := func(gpu string) (fits bool, capacity int64, step float64) {
		t.Helper()
		code, out, errs := run("plan", "--model", "llama-3.2-1b", "--gpu", gpu, "--micro-batch", "1", "--seq", "2048", "--precision", "bf16", "--json")
		if code != 0 {
			t.Fatalf("plan --gpu %s: exit %d: %s", gpu, code, errs)
		}
		var r struct {
			Fits     bool
			Capacity int64 `json:"capacity_bytes"`
			Time     struct {
				Step float64 `json:"step_s"`
			}
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		return r.Fits, r.Capacity, r.Time.Step
	}
	fits, capacity, slice := plan("h100-80gb-mig-3g.40gb")
	_, _, whole := plan("h100")
	// 39.50 GiB (nvidia-smi mig -lgip) less the CUDA context; 60 of 132
	// SMs and half the memory bandwidth: the step is between 2 and 132/60
	// = 2.2 times slower (bandwidth-bound and compute-bound parts).
	if !fits || capacity > 39.5*(1<<30) || capacity < 39*(1<<30) || slice < 1.9*whole || slice > 2.3*whole {
		t.Errorf("3g.40gb: fits %v capacity %d, step %.4gs vs whole H100 %.4gs", fits, capacity, slice, whole)
	}
	if code, _, errs := run("plan", "--model", "llama-3.2-1b", "--gpu", "h100-mig-9g.90gb"); code != 1 || !strings.Contains(errs, "h100-mig-9g.90gb") {
		t.Errorf("unknown MIG profile: exit %d, %q", code, errs)
	}
}
