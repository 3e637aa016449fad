package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/search"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// MaxJSON is the machine form of `memplan max` (memplan.max/v1).
type MaxJSON struct {
	Schema string `json:"schema"`
	// Dimension is the flag solved for, without its dashes.
	Dimension string `json:"dimension"`
	// Value is the largest value that fits (0: none does).
	Value int `json:"value"`
	// Step is the granule of the values tried; Cap bounds them, CapReason
	// says what sets it, AtCap that the answer is the bound.
	Step          int           `json:"step"`
	Cap           int           `json:"cap"`
	CapReason     string        `json:"cap_reason"`
	AtCap         bool          `json:"at_cap"`
	Plans         int           `json:"plans_simulated"`
	CapacityBytes units.Bytes   `json:"capacity_bytes"`
	At            *PlanJSON     `json:"at,omitempty"`
	Beyond        *PlanJSON     `json:"beyond,omitempty"`
	NextStep      *NextStepJSON `json:"next_step,omitempty"`
	Warnings      []string      `json:"warnings,omitempty"`
}

// BuildMax assembles the JSON form; next is the largest lever when nothing
// fits.
func BuildMax(r *search.MaxResult, next *engine.Row, warnings []string) *MaxJSON {
	j := &MaxJSON{Schema: "memplan.max/v1", Dimension: r.Dim.Field().Key(), Value: r.Value, Step: r.Step, Cap: r.Cap, CapReason: r.CapWhy,
		AtCap: r.Value > 0 && r.AtCap(), Plans: r.Plans, NextStep: NextStep(next), Warnings: warnings}
	if r.At != nil {
		j.At, j.CapacityBytes = Build(r.At, 0), r.At.Capacity
	}
	if r.Beyond != nil {
		j.Beyond, j.CapacityBytes = Build(r.Beyond, 0), r.Beyond.Capacity
	}
	return j
}

// WriteMaxJSON writes the JSON form.
func WriteMaxJSON(w io.Writer, r *search.MaxResult, next *engine.Row, warnings []string) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(BuildMax(r, next, warnings))
}

// WriteMaxText writes the answer for a person: the value, the plan at it
// and the plan one step beyond (where it overflows and what grew).
func WriteMaxText(w io.Writer, r *search.MaxResult, next *engine.Row) error {
	var b strings.Builder
	key := r.Dim.Field().Key()
	head := r.At
	if head == nil {
		head = r.Beyond
	}
	fmt.Fprintf(&b, "memplan max · --%s ? · %s\n\n", key, strings.TrimPrefix(textHeader(head), "memplan · "))
	switch {
	case r.At == nil:
		fmt.Fprintf(&b, "Nothing fits: even %s %d %s\n", key, r.Step, maxShort(r.Beyond))
		writeMaxPoint(&b, key, r.Beyond, nil)
		writeNextStep(&b, next)
	case r.AtCap():
		fmt.Fprintf(&b, "Largest %s that fits: %d, the bound of the search (%s); memory does not stop it\n", key, r.Value, r.CapWhy)
		writeMaxPoint(&b, key, r.At, nil)
	default:
		fmt.Fprintf(&b, "Largest %s that fits: %d on %s (%s usable)", key, r.Value, capacityName(r.At), r.At.Capacity)
		if hm := r.At.Spec.HostMemory; hm > 0 {
			fmt.Fprintf(&b, " and --host-memory %s", hm)
		}
		b.WriteString("\n")
		writeMaxPoint(&b, key, r.At, nil)
		writeMaxPoint(&b, key, r.Beyond, r.At)
	}
	grows := "grows"
	if r.Dim == search.DimGenTokens { // "the generated tokens grows"
		grows = "grow"
	}
	why := fmt.Sprintf("the peak never falls as the %s %s", r.Dim, grows)
	if ref := cmp.Or(r.At, r.Beyond); ref != nil && ref.Spec.Checkpoint.Kind == engine.CheckpointAuto {
		// Auto picks other blocks at other values, so the peak can fall;
		// but the blocks that fit one value fit every smaller one.
		why = fmt.Sprintf("--checkpoint auto picks other blocks as the %s %s, but the blocks that fit a value fit every smaller one", r.Dim, grows)
	}
	fmt.Fprintf(&b, "(%d plans simulated, each exact; %s, so every smaller value fits too)\n", r.Plans, why)
	_, err := io.WriteString(w, b.String())
	return err
}

// capacityName is what res was fitted to: its GPU or the budget.
func capacityName(res *engine.Result) string {
	if s := &res.Spec; s.GPU != nil && s.Capacity == 0 {
		return s.GPU.Name
	}
	return "the budget"
}

// maxShort says what res, a plan that does not fit, needs: more of its GPU
// or budget, more host memory than --host-memory, or both (over
// --host-memory alone, it needs 0 B more of the GPU).
func maxShort(res *engine.Result) string {
	var parts []string
	if res.Shortfall > 0 {
		parts = append(parts, fmt.Sprintf("%s more than %s (%s usable)", res.Shortfall, capacityName(res), res.Capacity))
	}
	if res.HostShortfall > 0 {
		parts = append(parts, fmt.Sprintf("%s more host memory per node than --host-memory %s", res.HostShortfall, res.Spec.HostMemory))
	}
	return "needs " + strings.Join(parts, " and ")
}

// overBy is how far res, a plan that does not fit, is over its GPU or
// budget, --host-memory, or both.
func overBy(res *engine.Result) string {
	var parts []string
	if res.Shortfall > 0 {
		parts = append(parts, fmt.Sprintf("%s over", res.Shortfall))
	}
	if res.HostShortfall > 0 {
		parts = append(parts, fmt.Sprintf("%s over --host-memory %s", res.HostShortfall, res.Spec.HostMemory))
	}
	return strings.Join(parts, ", ")
}

// maxPeak is the peak PeakBytes reports: the first step's when higher.
func maxPeak(res *engine.Result) (*ir.Program, sim.Point, string) {
	if res.First != nil && res.First.Peak.Total > res.Sim.Peak.Total {
		return res.FirstProgram, res.First.Peak, " of the first step"
	}
	return res.Program, res.Sim.Peak, ""
}

// writeMaxPoint writes one plan's line: its peak and where, and whether it
// fits; beside a fitting plan prev, the ledger categories that grew most.
func writeMaxPoint(b *strings.Builder, key string, res, prev *engine.Result) {
	p, pk, first := maxPeak(res)
	op := &p.Ops[pk.Op]
	v := map[string]int{"micro-batch": res.Spec.MicroBatch, "seq": res.Spec.Seq, "gen-tokens": res.Spec.GenTokens}[key]
	fmt.Fprintf(b, "  %s %d: peak %s in %s%s at %s", key, v, pk.Total, pk.Phase, first, where(op.Name, op.Module))
	if res.Fits {
		fmt.Fprintf(b, "; %s to spare\n", res.Headroom)
		return
	}
	fmt.Fprintf(b, "; DOES NOT FIT: %s", overBy(res))
	if prev != nil {
		_, was, _ := maxPeak(prev)
		type grew struct {
			c ir.Category
			d units.Bytes
		}
		var gs []grew
		for c := ir.Category(0); c < ir.NumCategories; c++ {
			if d := pk.Cat[c] - was.Cat[c]; d > 0 {
				gs = append(gs, grew{c, d})
			}
		}
		slices.SortStableFunc(gs, func(x, y grew) int { return cmp.Compare(y.d, x.d) })
		var parts []string
		if res.HostShortfall > 0 && res.HostPerNode > prev.HostPerNode {
			parts = append(parts, fmt.Sprintf("host memory per node +%s", res.HostPerNode-prev.HostPerNode))
		}
		for i, g := range gs {
			if i == 3 {
				break
			}
			parts = append(parts, fmt.Sprintf("%s +%s", g.c, g.d))
		}
		if len(parts) > 0 {
			fmt.Fprintf(b, "; grew at the peak: %s", strings.Join(parts, ", "))
		}
	}
	b.WriteString("\n")
}
