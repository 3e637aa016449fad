package cli

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/search"
)

// pinFlags are fit's strategy flags: given, each pins its dimension.
var pinFlags = []struct {
	flag string
	pin  search.Pins
}{
	{"micro-batch", search.PinMicroBatch}, {"accum", search.PinAccum}, {"tp", search.PinTP}, {"sp", search.PinSP},
	{"pp", search.PinPP}, {"dp", search.PinDP}, {"zero", search.PinZeRO}, {"fsdp", search.PinZeRO},
	{"checkpoint", search.PinCheckpoint}, {"offload", search.PinOffload}, {"optimizer-impl", search.PinImpl},
}

// denials are the families --deny closes: each pins a dimension at "none"
// (the flag and its value that would contradict it are named).
var denials = []struct {
	name, flag string
	pin        search.Pins
	none       func(*engine.Spec) bool
	set        func(*engine.Spec)
}{
	{"offload", "offload", search.PinOffload, func(s *engine.Spec) bool { return !s.Offload.Any() }, func(s *engine.Spec) { s.Offload = engine.Offload{} }},
	{"checkpoint", "checkpoint", search.PinCheckpoint, func(s *engine.Spec) bool { return s.Checkpoint.Kind == engine.NoCheckpoint },
		func(s *engine.Spec) { s.Checkpoint = engine.CheckpointPolicy{} }},
	{"zero", "zero", search.PinZeRO, func(s *engine.Spec) bool { return s.ZeRO == 0 }, func(s *engine.Spec) { s.ZeRO = 0 }},
	{"tp", "tp", search.PinTP | search.PinSP, func(s *engine.Spec) bool { return s.TP <= 1 && !s.SP }, func(s *engine.Spec) { s.TP, s.SP = 1, false }},
	{"sp", "sp", search.PinSP, func(s *engine.Spec) bool { return !s.SP }, func(s *engine.Spec) { s.SP = false }},
	{"pp", "pp", search.PinPP, func(s *engine.Spec) bool { return s.PP <= 1 }, func(s *engine.Spec) { s.PP = 1 }},
	{"accum", "accum", search.PinAccum, func(s *engine.Spec) bool { return s.Accum <= 1 }, func(s *engine.Spec) { s.Accum = 1 }},
	// A recipe may make the step fused (torchtune's fused: True, hf5's
	// adamw_torch_fused): denied, it is PyTorch's step without fused=True,
	// the multi-tensor one on CUDA (optimizer.py _default_to_fused_or_foreach).
	{"fused", "optimizer-impl", search.PinImpl, func(s *engine.Spec) bool { return s.Impl != lower.Fused }, func(s *engine.Spec) {
		if s.Impl == lower.Fused {
			s.Impl = lower.Foreach
		}
	}},
}

// fitPins are the dimensions the user pinned with strategy flags and
// --deny; deny closes its families in s.
func fitPins(changed func(string) bool, deny string, s *engine.Spec) (search.Pins, error) {
	var p search.Pins
	for _, pf := range pinFlags {
		if changed(pf.flag) {
			p |= pf.pin
		}
	}
	if deny == "" {
		return p, nil
	}
	for _, name := range strings.Split(deny, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(denials, func(d struct {
			name, flag string
			pin        search.Pins
			none       func(*engine.Spec) bool
			set        func(*engine.Spec)
		}) bool {
			return d.name == name
		})
		if i < 0 {
			var names []string
			for _, d := range denials {
				names = append(names, d.name)
			}
			return 0, badChoice("--deny", name, names...)
		}
		d := denials[i]
		if changed(d.flag) && !d.none(s) || d.name == "zero" && changed("fsdp") {
			return 0, fmt.Errorf("--%s %s contradicts --deny %s", d.flag, flagValue(d.flag, s), d.name)
		}
		d.set(s)
		if d.pin == search.PinImpl && s.Optimizer.Planned(s.Impl) == lower.Fused {
			// bitsandbytes' and torchao's step is their own fused kernel.
			return 0, fmt.Errorf("--deny %s: %v", d.name, s.Optimizer.CheckImpl(s.Impl))
		}
		p |= d.pin
	}
	return p, nil
}

// flagValue is flag's value in s, as the flag would say it.
func flagValue(flag string, s *engine.Spec) string {
	switch flag {
	case "offload":
		return s.Offload.String()
	case "checkpoint":
		return s.Checkpoint.String()
	case "zero":
		return fmt.Sprint(s.ZeRO)
	case "tp":
		return fmt.Sprint(s.TP)
	case "sp":
		return ""
	case "pp":
		return fmt.Sprint(s.PP)
	case "accum":
		return fmt.Sprint(s.Accum)
	case "optimizer-impl":
		return s.Impl.String()
	}
	return ""
}

// fitOnlyFlags are fit's flags planCommand does not echo: those a plan
// does not take (TestFitOnlyFlagsCoverPlansMissing), and --json; planSets
// are the flags planCommand writes from the plan itself.
var (
	fitOnlyFlags = []string{"gpus", "global-batch", "headroom", "allow", "deny", "json", "emit", "emit-out", "search-memory"}
	planSets     = []string{"micro-batch", "accum", "tp", "sp", "pp", "dp", "zero", "fsdp", "checkpoint", "offload", "optimizer-impl",
		"first-step", "precision", "optimizer", "lora", "qlora"}
)

// planCommand is the `memplan plan` command line that plans p exactly: the
// flags fit was given that describe the job, then every choice of p.
func planCommand(fl *pflag.FlagSet, base engine.Spec, p *search.Plan) string {
	args := []string{"memplan", "plan"}
	fl.Visit(func(f *pflag.Flag) {
		if slices.Contains(fitOnlyFlags, f.Name) || slices.Contains(planSets, f.Name) {
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			for _, v := range sv.GetSlice() {
				args = append(args, "--"+f.Name, shellQuote(v))
			}
			return
		}
		args = append(args, "--"+f.Name, shellQuote(f.Value.String()))
	})
	s := &p.Spec
	args = append(args, "--micro-batch", fmt.Sprint(s.MicroBatch), "--accum", fmt.Sprint(s.Accum), "--tp", fmt.Sprint(s.TP))
	if s.SP {
		args = append(args, "--sp")
	}
	args = append(args, "--pp", fmt.Sprint(s.PP), "--dp", fmt.Sprint(s.DP), "--zero", fmt.Sprint(s.ZeRO),
		"--checkpoint", shellQuote(s.Checkpoint.String()), "--offload", offloadFlag(s.Offload),
		"--optimizer-impl", s.Impl.String(), "--precision", s.Precision.String(), "--optimizer", s.Optimizer.String())
	if s.LoRA != nil {
		if s.LoRA == base.LoRA {
			args = append(args, "--lora", shellQuote(fl.Lookup("lora").Value.String()))
		} else {
			args = append(args, "--lora", shellQuote(fmt.Sprintf("r=%d,alpha=%g,targets=%s", s.LoRA.Rank, s.LoRA.Alpha, strings.Join(s.LoRA.Targets, ","))))
		}
		if s.QLoRA {
			args = append(args, "--qlora")
		}
	}
	// fit plans the steady step (the first step creates optimizer state
	// lazily, which plan also simulates unless told not to).
	return strings.Join(append(args, "--first-step=false"), " ")
}

func offloadFlag(o engine.Offload) string {
	if !o.Any() {
		return "none"
	}
	return o.String()
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9._/=,:+@%-]+$`)

// shellQuote quotes v for a POSIX shell when it needs it.
func shellQuote(v string) string {
	if shellSafe.MatchString(v) {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}
