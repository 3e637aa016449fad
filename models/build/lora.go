package build

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// LoRA configures low-rank adapters (Hu et al., 2021) as peft's LoraConfig
// does. Every base parameter is frozen (no gradient, no optimizer state);
// each target linear gets lora_A [r, in] and lora_B [out, r] (peft names
// "<linear>.lora_A.default.weight", the base weight moving to
// "<linear>.base_layer.weight") and computes
//
//	y = base(x) + lora_B(lora_A(dropout(x.to(adapter dtype)))) · alpha/r
//
// cast back to the base output's dtype. As peft's default
// autocast_adapter_dtype=True does, adapters over a 16-bit model are kept in
// float32 (and the input is cast to float32 for them); over float32 they are
// float32. Sequence-classification heads (BERT, ViT) stay trainable, as
// peft's SEQ_CLS task puts them in modules_to_save.
type LoRA struct {
	// Rank r (peft default 8).
	Rank int
	// Alpha is lora_alpha (peft default 8); it scales, it costs no memory.
	Alpha float64
	// Dropout is lora_dropout in [0, 1); 0 is nn.Identity (no mask).
	Dropout float64
	// Targets are module names matched as peft does (the module's path
	// equals the name or ends with "." + name: "q_proj", "self_attn.v_proj"),
	// or "all-linear": every linear except the output head and classifier.
	// Empty takes peft's default for the family
	// (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
	Targets []string
	// ModelDType keeps the adapters in the model's parameter dtype, as
	// litgpt and torchtune do, instead of peft's float32 over a 16-bit model.
	ModelDType bool
	// SharedDropout applies lora_dropout once per input, shared by every
	// adapter that reads it (litgpt's LoRAQKVLinear: one dropout on the
	// fused qkv input for query and value), instead of once per target.
	SharedDropout bool
	// QKV, when set, adapts only the enabled parts (query, key, value) of a
	// fused qkv target, as litgpt's LoRAQKVLinear does: lora_A is
	// [r·parts, in], lora_B [enabled widths, r], and the adapter output is
	// scattered into the full qkv width by zero_pad's index_copy, which
	// saves its source for backward.
	QKV *[3]bool
}

// AllLinear is the Targets value that selects every linear but the head.
const AllLinear = "all-linear"

func (l *LoRA) validate() error {
	if l.Rank <= 0 {
		return fmt.Errorf("%w: LoRA rank r must be positive, got %d", ErrBadOptions, l.Rank)
	}
	if !(l.Dropout >= 0 && l.Dropout < 1) {
		return fmt.Errorf("%w: LoRA dropout must be in [0, 1), got %g", ErrBadOptions, l.Dropout)
	}
	if math.IsNaN(l.Alpha) || math.IsInf(l.Alpha, 0) {
		return fmt.Errorf("%w: LoRA alpha must be finite, got %g", ErrBadOptions, l.Alpha)
	}
	for _, t := range l.Targets {
		if strings.TrimSpace(t) == "" {
			return fmt.Errorf("%w: empty LoRA target name", ErrBadOptions)
		}
	}
	return nil
}

// ParseLoRA reads the --lora flag: comma-separated key=value pairs
//
//	r=<rank>             positive integer (default 8)
//	alpha=<number>       lora_alpha (default 8)
//	dropout=<p>          lora_dropout in [0, 1) (default 0)
//	targets=<names>      module names joined by '+' or ',' , or all-linear
//	qkv=<parts>          the parts of a fused qkv target that are adapted,
//	                     q, k and v joined by '+' (litgpt's lora_query,
//	                     lora_key, lora_value; default: the whole linear)
//
// for example "r=16,alpha=32,dropout=0.05,targets=q_proj+v_proj" or
// "r=16,targets=q_proj,v_proj": since target lists may use commas, every
// token after targets= up to the next key= is a target. Keys may appear in
// any order, at most once. An empty string means peft's defaults.
func ParseLoRA(s string) (*LoRA, error) {
	l := &LoRA{Rank: 8, Alpha: 8}
	seen := map[string]bool{}
	inTargets := false
	s = strings.TrimSpace(s)
	if s == "" {
		return l, nil
	}
	for _, tok := range strings.Split(s, ",") {
		tok = strings.TrimSpace(tok)
		key, val, isKV := strings.Cut(tok, "=")
		if !isKV {
			if inTargets && tok != "" {
				l.Targets = append(l.Targets, splitTargets(tok)...)
				continue
			}
			return nil, fmt.Errorf("LoRA: %q is not key=value (keys: r, alpha, dropout, targets, qkv)", tok)
		}
		key = strings.ToLower(strings.TrimSpace(key))
		val = strings.TrimSpace(val)
		if seen[key] {
			return nil, fmt.Errorf("LoRA: key %q given twice", key)
		}
		seen[key] = true
		inTargets = false
		switch key {
		case "r", "rank":
			n, err := strconv.Atoi(val)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("LoRA: r must be a positive integer, got %q", val)
			}
			l.Rank = n
		case "alpha", "lora_alpha":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
				return nil, fmt.Errorf("LoRA: alpha must be a positive number, got %q", val)
			}
			l.Alpha = f
		case "dropout", "lora_dropout":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || !(f >= 0 && f < 1) {
				return nil, fmt.Errorf("LoRA: dropout must be a number in [0, 1), got %q", val)
			}
			l.Dropout = f
		case "targets", "target_modules":
			if val == "" {
				return nil, fmt.Errorf("LoRA: targets needs at least one module name")
			}
			l.Targets = append(l.Targets, splitTargets(val)...)
			inTargets = true
		case "qkv":
			qkv, err := parseQKVParts(val)
			if err != nil {
				return nil, err
			}
			l.QKV = qkv
		default:
			return nil, fmt.Errorf("LoRA: unknown key %q (keys: r, alpha, dropout, targets, qkv)", key)
		}
	}
	return l, nil
}

// parseQKVParts reads qkv=q+v: which of a fused qkv linear's query, key
// and value columns LoRA adapts.
func parseQKVParts(s string) (*[3]bool, error) {
	var parts [3]bool
	for _, p := range strings.Split(s, "+") {
		i := strings.Index("qkv", strings.ToLower(strings.TrimSpace(p)))
		if len(strings.TrimSpace(p)) != 1 || i < 0 {
			return nil, fmt.Errorf("LoRA: qkv takes q, k and v joined by + (litgpt's lora_query, lora_key, lora_value), got %q", s)
		}
		if parts[i] {
			return nil, fmt.Errorf("LoRA: qkv names %q twice", strings.TrimSpace(p))
		}
		parts[i] = true
	}
	return &parts, nil
}

func splitTargets(s string) []string {
	var out []string
	for _, t := range strings.Split(s, "+") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// defaultTargets are peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
// entries for the families memplan builds: the LoRATargets of the family's
// row of the models family table.
func defaultTargets(family string) []string {
	return models.DefaultLoRATargets(family)
}

type loraState struct {
	cfg     *LoRA
	all     bool
	targets []string
	matched map[string]bool
	// fusedQKV: the model has a fused qkv linear (qkv= can apply).
	fusedQKV bool
	// dropped is the shared dropout of each adapter input (SharedDropout).
	dropped map[ir.TensorID]ir.TensorID
}

// fusedQKVParts is the widths of the parts of a fused qkv linear that LoRA
// adapts (0: not adapted), or nil when the adapter covers the whole linear.
func (m *builder) fusedQKVParts(qd, kd int) []int64 {
	if m.lora == nil || m.lora.cfg.QKV == nil {
		return nil
	}
	e := m.lora.cfg.QKV
	w := []int64{int64(qd), int64(kd), int64(kd)}
	for i := range w {
		if !e[i] {
			w[i] = 0
		}
		w[i] /= int64(m.tp)
	}
	return w
}

// fusedQKVName is the fused query/key/value linear's module name: the
// family's own (GPT-2's c_attn, GPT-NeoX's query_key_value) or qkv_proj.
func fusedQKVName(a *models.Arch) string {
	switch a.Family {
	case models.FamilyGPT2:
		return "c_attn"
	case models.FamilyGPTNeoX:
		return "query_key_value"
	}
	return "qkv_proj"
}

// litgptQKV is litgpt's default adapter: lora_query and lora_value on the
// fused qkv linear, nothing else (finetune/lora.py @8641822 setup():
// lora_query=True, lora_key=False, lora_value=True, lora_projection=False,
// lora_mlp=False, lora_head=False).
var litgptQKV = [3]bool{true, false, true}

// newLoRAState resolves l's targets: when none are given, peft's defaults
// for the family under transformers' code, litgpt's under litgpt's.
func newLoRAState(a *models.Arch, l *LoRA, code Code) *loraState {
	s := &loraState{cfg: l, matched: map[string]bool{}, dropped: map[ir.TensorID]ir.TensorID{}}
	ts := l.Targets
	switch {
	case len(ts) == 0 && code == CodeLitGPT:
		ts = []string{fusedQKVName(a)}
		if l.QKV == nil {
			c, q := *l, litgptQKV // the caller's LoRA is shared by every build
			c.QKV = &q
			s.cfg = &c
		}
	case len(ts) == 0:
		ts = defaultTargets(a.Family)
	}
	for _, t := range ts {
		if t == AllLinear {
			s.all = true
			continue
		}
		s.targets = append(s.targets, t)
	}
	return s
}

// matches reports whether the linear at module path is a target (peft's
// check_target_module_exists: equal, or a suffix after a dot).
func (s *loraState) matches(path, leaf string) bool {
	hit := s.all
	for _, t := range s.targets {
		if path == t || strings.HasSuffix(path, "."+t) {
			s.matched[t] = true
			hit = true
		}
	}
	return hit
}

// matchesHead reports whether a target names the LM head at path (only
// explicitly: peft's all-linear leaves the output layer out).
func (s *loraState) matchesHead(path string) bool {
	hit := false
	for _, t := range s.targets {
		if path == t || strings.HasSuffix(path, "."+t) {
			s.matched[t] = true
			hit = true
		}
	}
	return hit
}

// unmatched fails on the first target no linear matched.
func (s *loraState) unmatched(a *models.Arch, names []string) error {
	if s.cfg.QKV != nil && !s.fusedQKV {
		return fmt.Errorf("%w: LoRA qkv= adapts parts of a fused qkv linear, and %s has none under this model code (its linears: %s)", ErrBadOptions, a.Name, strings.Join(names, ", "))
	}
	for _, t := range s.targets {
		if !s.matched[t] {
			return fmt.Errorf("%w: LoRA target %q matches no linear module of %s (its linears: %s)", ErrBadOptions, t, a.Name, strings.Join(names, ", "))
		}
	}
	return nil
}

// noteLinear records a linear's leaf name for error messages.
func (m *builder) noteLinear(name string) {
	leaf := name[strings.LastIndex(name, ".")+1:]
	for _, n := range m.linearNames {
		if n == leaf {
			return
		}
	}
	m.linearNames = append(m.linearNames, leaf)
}

// adapterDType is the dtype peft keeps adapters in: float32 over a 16-bit
// model (get_peft_model's autocast_adapter_dtype=True), else the model's.
func (m *builder) adapterDType() units.DType {
	dt := m.o.Precision.ParamDType()
	if m.lora.cfg.ModelDType {
		return dt
	}
	if dt == units.BF16 || dt == units.F16 {
		return units.F32
	}
	return dt
}

// loraBranch adds the adapter of the linear whose scope is current, over its
// input x (this rank's: the full input of a column-parallel linear, the
// shard of a row-parallel one) and base output y with in and out local
// features. A column-parallel base gets a replicated lora_A and a sharded
// lora_B, a row-parallel one a sharded lora_A and a replicated lora_B whose
// partial output joins the base's before the reduction (NeMo's
// tensor-parallel LoRA). It follows peft's lora.Linear.forward, or
// lora.bnb.Linear4bit.forward under QLoRA (which clones the base output and
// casts only when autocast is off).
func (m *builder) loraBranch(x, y ir.TensorID, in, out int64) ir.TensorID {
	b, cfg := m.b, m.lora.cfg
	adt := m.adapterDType()
	resDT := b.Tensor(y).DType
	autocast := m.o.Precision.AutocastDType() != units.Invalid
	if m.o.QLoRA && m.o.Code == CodeHF {
		// "As per Tim Dettmers, for 4bit, we need to defensively clone here."
		y = b.Copy("base_clone", y)
	}
	// A fused qkv whose enabled parts alone are adapted (litgpt).
	parts, width := int64(1), out
	if w := m.qkvParts; w != nil {
		parts, width = 0, 0
		for _, x := range w {
			if x > 0 {
				parts++
				width += x
			}
		}
	}
	castIn := !m.o.QLoRA || !autocast
	xa := x
	if castIn {
		xa = b.ToAs("lora_input", x, adt)
	}
	r := int64(cfg.Rank)
	d, shared := m.lora.dropped[xa]
	if !shared {
		d = func() ir.TensorID {
			defer b.Enter("lora_dropout.default")()
			return b.Dropout("out", xa, cfg.Dropout)
		}()
		if cfg.SharedDropout {
			m.lora.dropped[xa] = d
		}
	}
	a := func() ir.TensorID {
		defer b.Enter("lora_A.default")()
		w := b.TypedParam("weight", adt, r*parts, in)
		o := b.Linear("out", d, w, ir.NoTensor)
		if shard, ok := m.shardOf[d]; ok {
			b.SaveShard(shard, m.comm(ir.AllGather, ir.TensorGroup, m.tp, d))
		}
		return o
	}()
	lo := func() ir.TensorID {
		defer b.Enter("lora_B.default")()
		w := b.TypedParam("weight", adt, width, r)
		return b.Linear("out", a, w, ir.NoTensor)
	}()
	if width != out {
		// zero_pad: index_copy into zeros of the full width keeps its source.
		sh := b.Shape(lo)
		sh[len(sh)-1] = out
		lo = b.IndexCopy("zero_pad", lo, sh...)
	}
	lo = b.Scale("scaling", lo)
	if m.o.QLoRA {
		if castIn {
			lo = b.ToAs("lora_out", lo, resDT)
		}
		return b.Binary("add", "lora_add", y, lo)
	}
	return b.ToAs("result", b.Binary("add", "lora_add", y, lo), resDT)
}
