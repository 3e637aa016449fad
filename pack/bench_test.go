package pack

import (
	"fmt"
	"testing"
	"time"

	"github.com/memplan/memplan/units"
)

// benchEnvelopes are n processes of four shapes with 256-sample curves.
func benchEnvelopes(n int) []*Envelope {
	var out []*Envelope
	for i := range n {
		alloc := units.Bytes(8+(i%4)*8) << 30
		e := &Envelope{Job: fmt.Sprintf("j%d", i), Context: 400_000_000, ModelSize: alloc / 4, Allocated: alloc,
			Cap: alloc + 1<<30, Peak: alloc + 2<<30, Period: 1 + float64(i%3)}
		for k := range maxSamples {
			t := e.Period * float64(k+1) / maxSamples
			e.Curve = append(e.Curve, Sample{t, alloc / 2})
			e.Capped = append(e.Capped, Sample{t, e.Cap})
			e.Reserved = append(e.Reserved, Sample{t, e.Peak})
		}
		e.Curve[maxSamples/2].Bytes = alloc
		out = append(out, e)
	}
	return out
}

// 1,000 processes on 256 H100s under the four policies.
func BenchmarkPackEnvelopes1000(b *testing.B) {
	pool, _ := ParsePool("256xh100")
	envs := benchEnvelopes(1000)
	for b.Loop() {
		if _, err := PackEnvelopes(envs, pool, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// 10,000 arrivals of 20 job shapes on 64 H100s under the four policies.
func BenchmarkSimulate10000(b *testing.B) {
	pool, _ := ParsePool("64xh100")
	envs := benchEnvelopes(20)
	byJob := map[string]*Envelope{}
	var names []string
	for _, e := range envs {
		byJob[e.Job] = e
		names = append(names, e.Job)
	}
	tr := GenerateArrivals(1, 10000, names, 2*time.Minute, 3*time.Hour)
	for b.Loop() {
		if _, err := Simulate(byJob, tr, pool, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
