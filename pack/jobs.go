package pack

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/published"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/serve"
	"github.com/memplan/memplan/snapshot"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// Kind is the version of the job file this package reads.
const Kind = "memplan.jobs/v1"

// MaxFileBytes bounds a job file, an arrival trace and a plan JSON a job
// names, and what aliases may expand a job file or a trace to; a snapshot
// may be larger (maxSnapshotBytes).
const (
	MaxFileBytes     = 16 << 20
	maxSnapshotBytes = 1 << 30
	maxJobs          = 4096
	maxReplicas      = 1024
)

// ErrInput wraps every problem with a job file, an arrival trace or what
// they name.
var ErrInput = errors.New("invalid pack input")

type inputError struct{ msg string }

func (e *inputError) Error() string { return e.msg }
func (e *inputError) Unwrap() error { return ErrInput }

func bad(where, format string, a ...any) error {
	return &inputError{where + ": " + fmt.Sprintf(format, a...)}
}

// File is a job file: the jobs to place on a pool of GPUs.
type File struct {
	Kind string `json:"kind"`
	Jobs []Job  `json:"jobs"`
}

// Job is one entry of a job file: exactly one of Train, Serve, Plan or
// Snapshot says what runs.
type Job struct {
	Name string `json:"name"`
	// Train is a training job as plan describes it (its flags' names,
	// without the GPU).
	Train *Train `json:"train,omitempty"`
	// Serve is an inference service: a model answering Concurrency
	// requests at once, each Context prompt tokens plus GenTokens
	// generated.
	Serve *Serve `json:"serve,omitempty"`
	// Plan is a file written by 'memplan plan --json' (with --gpu, so it
	// has a step time, and with its timeline).
	Plan string `json:"plan,omitempty"`
	// Snapshot is a CUDA memory snapshot (torch.cuda.memory._dump_snapshot)
	// whose measured curve is the job's; Device picks its device (default:
	// the one with the largest allocated peak); Period is the wall time
	// its trace covers when the snapshot recorded no times.
	Snapshot string `json:"snapshot,omitempty"`
	Device   *int64 `json:"device,omitempty"`
	Period   string `json:"period,omitempty"`
	// Published is a row of a memplan.published/v1 file, "FILE#ID": a
	// published measurement's job in its framework's terms, mapped to a
	// job as package published maps it (Row.Job).
	Published string `json:"published,omitempty"`
	// Request is the memory the user declares for the job (HAMi's
	// nvidia.com/gpumem, gpushare's aliyun.com/gpu-mem), e.g. "40GiB";
	// the static policy uses it, model_size when it is empty.
	Request string `json:"request,omitempty"`
	// Replicas is how many copies of the job run (default 1).
	Replicas int `json:"replicas,omitempty"`
	// SameNode says a job of several GPUs (tp, pp, dp) must have all its
	// GPUs in one node of the pool (tensor parallelism over NVLink, as a
	// rule); without it its GPUs may span nodes. Either way they are
	// placed all or none.
	SameNode bool `json:"same-node,omitempty"`

	// Filled by ReadFile from the files the job names.
	planData []byte
	snap     *snapshot.Snapshot
	pubSpec  *engine.Spec
}

// Train is a training job in plan's terms: each field is the plan flag of
// the same name.
type Train struct {
	Model         string   `json:"model"`
	MicroBatch    int      `json:"micro-batch,omitempty"`
	Seq           int      `json:"seq,omitempty"`
	Accum         int      `json:"accum,omitempty"`
	Precision     string   `json:"precision,omitempty"`
	Optimizer     string   `json:"optimizer,omitempty"`
	OptimizerImpl string   `json:"optimizer-impl,omitempty"`
	Attention     string   `json:"attention,omitempty"`
	Kernels       string   `json:"kernels,omitempty"`
	Checkpoint    string   `json:"checkpoint,omitempty"`
	Offload       string   `json:"offload,omitempty"`
	LoRA          string   `json:"lora,omitempty"`
	QLoRA         bool     `json:"qlora,omitempty"`
	Recipe        string   `json:"recipe,omitempty"`
	Set           []string `json:"set,omitempty"`
	// The parallel layout, plan's flags of the same names: the job runs on
	// dp × tp × pp GPUs, one process each (pack places them as a gang).
	TP           int    `json:"tp,omitempty"`
	SP           bool   `json:"sp,omitempty"`
	EP           int    `json:"ep,omitempty"`
	DP           int    `json:"dp,omitempty"`
	ZeRO         int    `json:"zero,omitempty"`
	PP           int    `json:"pp,omitempty"`
	PPSchedule   string `json:"pp-schedule,omitempty"`
	PPInterleave int    `json:"pp-interleave,omitempty"`
}

// Serve is an inference service answering Concurrency requests at once,
// each of Context prompt tokens and GenTokens generated ones. Server says
// how it serves: vllm (the default; package serve: weights, the profile
// run's peak, paged KV blocks sized by gpu_memory_utilization, CUDA
// graphs) or hf (engine's inference mode: transformers' generate with a
// KV cache growing per request, PyTorch's caching allocator).
type Serve struct {
	Model       string `json:"model"`
	Concurrency int    `json:"concurrency"`
	Context     int    `json:"context"`
	GenTokens   int    `json:"gen-tokens,omitempty"`
	Server      string `json:"server,omitempty"`
	// TP is the tensor-parallel degree (vLLM's --tensor-parallel-size,
	// engine's tp under hf): the service runs on TP GPUs, one process each.
	TP int `json:"tp,omitempty"`
	// vllm: max_model_len (default Context+GenTokens: a deployment sized
	// for its requests) and --enforce-eager.
	MaxModelLen  int  `json:"max-model-len,omitempty"`
	EnforceEager bool `json:"enforce-eager,omitempty"`
	// hf: plan's names.
	Precision string   `json:"precision,omitempty"`
	Attention string   `json:"attention,omitempty"`
	Kernels   string   `json:"kernels,omitempty"`
	Recipe    string   `json:"recipe,omitempty"`
	Set       []string `json:"set,omitempty"`
}

// ReadFile reads a job file and the plan and snapshot files its jobs name
// (relative to the job file).
func ReadFile(path string) (*File, error) {
	data, err := readBounded(path, MaxFileBytes)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	f, err := parse(data, path, dir)
	if err != nil {
		return nil, err
	}
	for i := range f.Jobs {
		if err := f.Jobs[i].load(dir, where(path, i, f.Jobs[i].Name)); err != nil {
			return nil, err
		}
	}
	if err := checkWork(path, f.Jobs); err != nil {
		return nil, err
	}
	return f, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	fh, err := boundedio.Open(path)
	if err != nil {
		return nil, &inputError{err.Error()}
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, &inputError{fmt.Sprintf("cannot read %s: %v", path, unwrapPath(err))}
	}
	if int64(len(data)) > limit {
		return nil, bad(path, "larger than %s", units.Bytes(limit))
	}
	return data, nil
}

// unwrapPath drops the Go operation and path a *PathError repeats.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func where(file string, i int, name string) string {
	if name == "" {
		return fmt.Sprintf("%s: jobs[%d]", file, i)
	}
	return fmt.Sprintf("%s: job %q", file, name)
}

// load reads the plan or snapshot file j names.
func (j *Job) load(dir, at string) error {
	switch {
	case j.Plan != "":
		data, err := readBounded(filepath.Join(dir, j.Plan), MaxFileBytes)
		if err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		j.planData = data
		if _, err = parsePlan(data); err != nil {
			return bad(at, "plan file %s: %v", j.Plan, err)
		}
	case j.Published != "":
		file, id, _ := strings.Cut(j.Published, "#")
		path := filepath.Join(dir, file)
		data, err := readBounded(path, MaxFileBytes)
		if err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		rows, err := published.Read(bytes.NewReader(data), file)
		if err != nil {
			return bad(at, "%s", strings.TrimPrefix(oneLine(err.Error()), published.ErrFile.Error()+": "))
		}
		i := slices.IndexFunc(rows, func(r published.Row) bool { return r.ID == id })
		if i < 0 {
			return bad(at, "%s has no row %q", file, cut(id))
		}
		spec, _, lacks := rows[i].Job(filepath.Dir(path))
		if len(lacks) > 0 {
			return bad(at, "row %s of %s cannot be planned: %s", id, file, lacks[0])
		}
		j.pubSpec = spec
	case j.Snapshot != "":
		data, err := readBounded(filepath.Join(dir, j.Snapshot), maxSnapshotBytes)
		if err != nil {
			return fmt.Errorf("%s: snapshot: %w", at, err)
		}
		if j.snap, err = snapshot.Parse(data); err != nil {
			return bad(at, "snapshot %s: %v", j.Snapshot, err)
		}
	}
	return nil
}

// SetPlan gives j the bytes of a plan JSON (what ReadFile reads from
// j.Plan), for callers that hold it in memory.
func (j *Job) SetPlan(data []byte) error {
	if _, err := parsePlan(data); err != nil {
		return err
	}
	j.planData = data
	if j.Plan == "" {
		j.Plan = "(inline)"
	}
	return nil
}

// SetSnapshot gives j a parsed snapshot (what ReadFile reads from
// j.Snapshot).
func (j *Job) SetSnapshot(s *snapshot.Snapshot) {
	j.snap = s
	if j.Snapshot == "" {
		j.Snapshot = "(inline)"
	}
}

// Parse reads a job file's bytes (YAML or JSON) strictly: unknown keys,
// a wrong kind, duplicate names and jobs that say what runs twice or not
// at all are errors naming the job and the key. name is the file's name in
// messages.
func Parse(data []byte, name string) (*File, error) { return parse(data, name, "") }

// parse is Parse with a model given as a relative path (a config.json or
// a snapshot directory) taken relative to dir, as the files a job names are.
func parse(data []byte, name, dir string) (*File, error) {
	if len(data) > MaxFileBytes {
		return nil, bad(name, "larger than %s", units.Bytes(MaxFileBytes))
	}
	var f File
	if err := strictYAML(data, &f); err != nil {
		return nil, bad(name, "%v", err)
	}
	if f.Kind != Kind {
		if f.Kind == "" {
			return nil, bad(name, "no kind (want kind: %s)", Kind)
		}
		return nil, bad(name, "kind %q is not %s", cut(f.Kind), Kind)
	}
	if len(f.Jobs) == 0 {
		return nil, bad(name, "no jobs")
	}
	if len(f.Jobs) > maxJobs {
		return nil, bad(name, "%d jobs, more than %d", len(f.Jobs), maxJobs)
	}
	seen := map[string]int{}
	total := 0
	for i := range f.Jobs {
		j := &f.Jobs[i]
		at := where(name, i, j.Name)
		j.relativeModel(dir)
		if err := j.check(at); err != nil {
			return nil, err
		}
		if k, ok := seen[j.Name]; ok {
			return nil, bad(at, "name used by jobs[%d] too", k)
		}
		seen[j.Name] = i
		total += j.replicas()
		if total > maxJobs {
			return nil, bad(at, "more than %d jobs with replicas", maxJobs)
		}
	}
	return &f, nil
}

// strictYAML unmarshals YAML or JSON into v, refusing unknown keys (keys
// match as written, exactKeys) and trailing documents; aliases may expand
// the document to MaxFileBytes, what a file without them may hold
// (yamlerr.ToJSON).
func strictYAML(data []byte, v any) error {
	js, err := yamlerr.ToJSON(data, MaxFileBytes, true)
	if err != nil {
		return errors.New(yamlerr.Message(err))
	}
	if err := exactKeys(js, reflect.TypeOf(v)); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New(yamlerr.Message(err))
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// cut shortens a value quoted in a message.
func cut(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func (j *Job) replicas() int { return max(j.Replicas, 1) }

// relativeModel takes a model given as a relative path that exists under
// dir (a config.json or a model directory) relative to dir; a catalog name
// stays as it is.
func (j *Job) relativeModel(dir string) {
	if dir == "" {
		return
	}
	for _, m := range []*string{trainModel(j.Train), serveModel(j.Serve)} {
		if m == nil || *m == "" || filepath.IsAbs(*m) {
			continue
		}
		if p := filepath.Join(dir, *m); fileExists(p) {
			*m = p
		}
	}
}

func trainModel(t *Train) *string {
	if t == nil {
		return nil
	}
	return &t.Model
}

func serveModel(v *Serve) *string {
	if v == nil {
		return nil
	}
	return &v.Model
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// check validates what can be checked without planning.
func (j *Job) check(at string) error {
	if strings.TrimSpace(j.Name) == "" {
		return bad(at, "no name")
	}
	if len(j.Name) > 128 || strings.ContainsAny(j.Name, "\n\r\t") {
		return bad(at, "name must be one line of at most 128 characters")
	}
	n := 0
	for _, set := range []bool{j.Train != nil, j.Serve != nil, j.Plan != "", j.Snapshot != "", j.Published != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return bad(at, "give exactly one of train, serve, plan, snapshot or published (found %d)", n)
	}
	if j.Published != "" {
		if file, id, ok := strings.Cut(j.Published, "#"); !ok || file == "" || id == "" {
			return bad(at, "published %q is not FILE#ID", cut(j.Published))
		}
	}
	if j.Replicas < 0 || j.Replicas > maxReplicas {
		return bad(at, "replicas must be between 1 and %d, got %d", maxReplicas, j.Replicas)
	}
	if j.Request != "" {
		b, err := units.ParseBytes(j.Request)
		if err != nil || b <= 0 {
			return bad(at, "request %q is not a positive size such as 40GiB", cut(j.Request))
		}
	}
	if j.Snapshot == "" && (j.Device != nil || j.Period != "") {
		return bad(at, "device and period go with snapshot")
	}
	if j.Period != "" {
		if _, err := parsePeriod(j.Period); err != nil {
			return bad(at, "period: %v", err)
		}
	}
	switch {
	case j.Train != nil:
		_, err := j.Train.Spec()
		return wrapField(at, "train", err)
	case j.Serve != nil:
		return wrapField(at, "serve", j.Serve.check())
	}
	return nil
}

// Servers are the serving engines a serve job may name.
var Servers = []string{"vllm", "hf"}

func (v *Serve) server() string { return or(v.Server, "vllm") }

func (v *Serve) check() error {
	switch v.server() {
	case "hf":
		if v.MaxModelLen != 0 || v.EnforceEager {
			return fmt.Errorf("max-model-len and enforce-eager go with server vllm")
		}
		_, err := v.Spec()
		return err
	case "vllm":
		if v.Precision != "" || v.Attention != "" || v.Kernels != "" || v.Recipe != "" || len(v.Set) > 0 {
			return fmt.Errorf("precision, attention, kernels, recipe and set go with server hf")
		}
		_, err := v.VLLM(nil)
		return err
	}
	return fmt.Errorf("server %q is not one of %s", cut(v.Server), strings.Join(Servers, ", "))
}

// VLLM is the service as package serve plans a vLLM deployment on g (nil:
// checked without a GPU): max_model_len the requests' tokens unless given,
// max_num_seqs at least Concurrency. Utilization is left to the caller.
func (v *Serve) VLLM(g *hw.GPU) (serve.Spec, error) {
	var s serve.Spec
	if err := v.sizes(); err != nil {
		return s, err
	}
	m, err := models.Resolve(v.Model)
	if err != nil {
		return s, engine.FieldErrorf(engine.FieldModel, "%s", oneLine(err.Error()))
	}
	tokens := v.Context + v.GenTokens
	s = serve.Spec{Model: m, GPU: g, MaxModelLen: or0(v.MaxModelLen, tokens), Context: tokens, EnforceEager: v.EnforceEager,
		MaxNumSeqs: max(serve.DefaultMaxNumSeqs, v.Concurrency), TP: max(v.TP, 1)}
	if g == nil {
		s.TotalMemory = 1 << 40 // checks the sizes only
	}
	c := s
	if err := c.Validate(); err != nil {
		var fe *serve.FieldError
		if errors.As(err, &fe) && fe.Field == serve.FieldBatchedTokens && c.MaxNumBatchedTokens < c.MaxNumSeqs {
			// The job has neither vLLM field: say it in its own keys.
			return s, fmt.Errorf("concurrency %d is more than the %d tokens vLLM schedules in one step at max-model-len %d (vLLM refuses --max-num-seqs above --max-num-batched-tokens): give at most concurrency %d",
				v.Concurrency, c.MaxNumBatchedTokens, c.MaxModelLen, c.MaxNumBatchedTokens)
		}
		if errors.As(err, &fe) {
			return s, errors.New(strings.NewReplacer("{", "", "}", "").Replace(fe.Msg))
		}
		return s, err
	}
	return s, nil
}

func (v *Serve) sizes() error {
	if strings.TrimSpace(v.Model) == "" {
		return engine.FieldErrorf(engine.FieldModel, "no {model}")
	}
	if v.Concurrency < 1 || v.Concurrency > 1<<20 {
		return fmt.Errorf("concurrency must be between 1 and 2^20, got %d", v.Concurrency)
	}
	if v.Context < 1 || v.Context > 1<<24 {
		return fmt.Errorf("context must be between 1 and 2^24 tokens, got %d", v.Context)
	}
	if v.GenTokens < 0 || v.GenTokens > 1<<24 {
		return engine.FieldErrorf(engine.FieldGenTokens, "{gen-tokens} must be between 0 and 2^24, got %d", v.GenTokens)
	}
	if v.TP < 0 || v.TP > maxGang {
		return fmt.Errorf("tp must be between 1 and %d, got %d", maxGang, v.TP)
	}
	return nil
}

func or0(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// wrapField names the key of the job an engine error is about.
func wrapField(at, part string, err error) error {
	if err == nil {
		return nil
	}
	var fe *engine.FieldError
	if errors.As(err, &fe) {
		msg := fe.Render(engine.Field.Key)
		if fe.Field != engine.FieldNone {
			return bad(at, "%s.%s: %s", part, fe.Field.Key(), msg)
		}
		return bad(at, "%s: %s", part, msg)
	}
	return bad(at, "%s: %v", part, err)
}

// base fills what every job shares: the model and the names of the
// precision, attention and kernels.
func base(s *engine.Spec, model, precision, attention, kernels string) error {
	var err error
	if strings.TrimSpace(model) == "" {
		return engine.FieldErrorf(engine.FieldModel, "no {model}")
	}
	if s.Model, err = models.Resolve(model); err != nil {
		return engine.FieldErrorf(engine.FieldModel, "%s", oneLine(err.Error()))
	}
	if s.Precision, err = ops.ParsePrecision(precision); err != nil {
		return engine.FieldErrorf(engine.FieldPrecision, "%s", oneLine(err.Error()))
	}
	if s.Attention, err = build.ParseAttention(attention); err != nil {
		return fmt.Errorf("attention: %v", err)
	}
	switch kernels {
	case "", "cuda":
		s.Device = ops.CUDA
	case "cpu":
		s.Device = ops.CPU
	default:
		return fmt.Errorf("kernels %q is not cuda or cpu", cut(kernels))
	}
	return nil
}

// applyRecipe applies recipe rec (default hf, as plan's) with its settings
// sets; a switch that mirrors a key the job gave yields to it, as it yields
// to plan's flag.
func applyRecipe(s *engine.Spec, rec string, sets []string, explicit func(string) bool) error {
	if rec == "" {
		rec = "hf"
	}
	r, err := recipe.Load(rec)
	if err != nil {
		return fmt.Errorf("recipe: %v", oneLine(err.Error()))
	}
	r = r.Clone()
	for _, kv := range sets {
		if err := r.Set(kv); err != nil {
			return engine.FieldErrorf(engine.FieldSet, "%s", oneLine(err.Error()))
		}
	}
	return r.Apply(s, explicit)
}

// Spec is the training job as engine plans it, with plan's defaults
// (amp-bf16, adamw foreach, sdpa, the hf recipe, the first step planned
// too).
func (t *Train) Spec() (engine.Spec, error) {
	s := engine.Spec{}
	s.Mode, s.FirstStep = engine.Train, true
	given := map[string]bool{"precision": t.Precision != "", "optimizer": t.Optimizer != "", "optimizer-impl": t.OptimizerImpl != "",
		"attention": t.Attention != "", "checkpoint": t.Checkpoint != "", "kernels": t.Kernels != ""}
	if err := base(&s, t.Model, or(t.Precision, "amp-bf16"), or(t.Attention, "sdpa"), t.Kernels); err != nil {
		return s, err
	}
	var err error
	if s.Optimizer, err = lower.ParseOptimizer(or(t.Optimizer, "adamw")); err != nil {
		return s, fmt.Errorf("optimizer: %v", err)
	}
	if s.Impl, err = lower.ParseImpl(or(t.OptimizerImpl, "foreach")); err != nil {
		return s, fmt.Errorf("optimizer-impl: %v", err)
	}
	if s.Checkpoint, err = engine.ParseCheckpoint(or(t.Checkpoint, "none")); err != nil {
		return s, err
	}
	if s.Offload, err = engine.ParseOffload(or(t.Offload, "none")); err != nil {
		return s, err
	}
	if t.LoRA != "" {
		if s.LoRA, err = build.ParseLoRA(t.LoRA); err != nil {
			return s, engine.FieldErrorf(engine.FieldLoRA, "%s", strings.TrimPrefix(oneLine(err.Error()), "LoRA: "))
		}
	}
	s.QLoRA = t.QLoRA
	if err := t.parallel(&s); err != nil {
		return s, err
	}
	for _, v := range []struct {
		f        engine.Field
		val, min int
	}{{engine.FieldMicroBatch, t.MicroBatch, 0}, {engine.FieldSeq, t.Seq, 0}, {engine.FieldAccum, t.Accum, 0}} {
		if v.val < v.min {
			return s, engine.FieldErrorf(v.f, "{%s} must be positive, got %d", v.f.Key(), v.val)
		}
	}
	s.MicroBatch, s.Seq, s.Accum = max(t.MicroBatch, 1), t.Seq, max(t.Accum, 1)
	if err := applyRecipe(&s, t.Recipe, t.Set, func(flag string) bool { return given[flag] }); err != nil {
		return s, err
	}
	// A step the job names that its optimizer lacks is refused, as plan
	// refuses --optimizer-impl; a recipe's is planned as the optimizer's own.
	if err := s.Optimizer.CheckImpl(s.Impl); err != nil && (given["optimizer-impl"] || slices.ContainsFunc(t.Set, func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return strings.TrimSpace(k) == "optimizer.impl"
	})) {
		return s, fmt.Errorf("optimizer-impl %s: %v", s.Impl, err)
	}
	return s, s.Validate()
}

// maxGang bounds the GPUs of one job.
const maxGang = 4096

// parallel sets the parallel layout as plan's flags do (cli specParallel):
// degrees of at least 1 (0: the default, 1), the schedule by name.
func (t *Train) parallel(s *engine.Spec) error {
	for _, d := range []struct {
		key string
		v   int
	}{{"tp", t.TP}, {"ep", t.EP}, {"dp", t.DP}, {"pp", t.PP}, {"pp-interleave", t.PPInterleave}} {
		if d.v < 0 || d.v > maxGang {
			return fmt.Errorf("%s must be between 1 and %d, got %d", d.key, maxGang, d.v)
		}
	}
	s.TP, s.SP, s.EP, s.DP, s.ZeRO, s.PP, s.PPInterleave = max(t.TP, 1), t.SP, max(t.EP, 1), max(t.DP, 1), t.ZeRO, max(t.PP, 1), max(t.PPInterleave, 1)
	if s.JobGPUs() > maxGang {
		return fmt.Errorf("dp × tp × pp is %d GPUs, more than %d", s.JobGPUs(), maxGang)
	}
	var err error
	if s.PPSchedule, err = strategy.ParseSchedule(or(t.PPSchedule, "1f1b")); err != nil {
		return fmt.Errorf("pp-schedule: %v", err)
	}
	return nil
}

// Spec is the service as engine's inference mode plans it: a batch of
// Concurrency sequences, a prompt of Context tokens, GenTokens generated
// (the KV cache holds Context+GenTokens per sequence); the weights in
// pure-bf16 unless Precision says otherwise.
func (v *Serve) Spec() (engine.Spec, error) {
	s := engine.Spec{}
	s.Mode = engine.Infer
	given := map[string]bool{"precision": v.Precision != "", "attention": v.Attention != "", "kernels": v.Kernels != ""}
	if err := v.sizes(); err != nil {
		return s, err
	}
	if err := base(&s, v.Model, or(v.Precision, "pure-bf16"), or(v.Attention, "sdpa"), v.Kernels); err != nil {
		return s, err
	}
	s.MicroBatch, s.Seq, s.GenTokens, s.Accum = v.Concurrency, v.Context, v.GenTokens, 1
	s.TP, s.EP, s.PPInterleave = max(v.TP, 1), 1, 1
	if err := applyRecipe(&s, v.Recipe, v.Set, func(flag string) bool { return given[flag] }); err != nil {
		return s, err
	}
	return s, s.Validate()
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
