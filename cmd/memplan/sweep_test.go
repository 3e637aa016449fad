package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memplan/memplan/units"
)

// TestSweep runs the built memplan over a seeded random sample of ordinary
// jobs (issue 15's crash sweep: plan llama-3.2-1b 1 × 1024 on an rtx-4090
// panicked in the text report's reserved line, out of reach of the probes,
// which drive --json without a GPU): every catalog model × a handful of
// GPUs (small, mid, large, MIG) × train/infer/serve × micro-batch × seq ×
// precision × optimizer × checkpoint/offload/ZeRO/TP/PP/DP/LoRA variations,
// for plan (text with its chart and JSON, first step on and off), compare,
// max ('?'), diagnose and fit, each in text and JSON. It checks each answer:
// no panic or internal error; exit 0, 3 or 4, or a one-line refusal (exit
// 1); the text and the JSON agree on the exit status and the peak; the JSON
// decodes with no NaN, Inf or negative size (sane), every plan in it peaks
// at least as high as each phase and its reserved peak is at least its
// allocated one; a text report's reserved line reserves at least what its
// blocks hold; fit's reproducing command plans the winner's peak.
//
//	go test ./cmd/memplan -run TestSweep                       # 16 jobs on models under 600M parameters (part of the normal run)
//	MEMPLAN_SWEEP=1 nice go test ./cmd/memplan -run TestSweep -timeout 60m -v
//	MEMPLAN_SWEEP=1 MEMPLAN_SWEEP_N=600 MEMPLAN_SWEEP_SEED=7 ...   # jobs, seed
//
// A command over 45 s is logged as slow, not failed (deepseek-v3's plans
// take minutes); a sweep's log ends with the counts by command and exit
// status, the slowest commands, the refusals and the wall time. 600 jobs
// are about 1,200 commands, 15 minutes on the project's shared 2-core host
// at a load of 14 (700 jobs, 1,390 commands: 17 min 20 s with a 90 s limit).
func TestSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("builds memplan and runs it per job")
	}
	cfg := sweepConfig{jobs: 16, seed: 1, limit: 20 * time.Second, quick: true}
	if os.Getenv("MEMPLAN_SWEEP") != "" {
		cfg = sweepConfig{jobs: envInt(t, "MEMPLAN_SWEEP_N", 600), seed: uint64(envInt(t, "MEMPLAN_SWEEP_SEED", 1)),
			limit: 45 * time.Second}
	}
	bin := filepath.Join(t.TempDir(), "memplan")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cat := loadSweepCatalog(t, bin, cfg.quick)
	jobs := sampleJobs(cat, cfg)
	start := time.Now()
	st := &sweepStats{byKey: map[string]int{}, refused: map[string]int{}}
	sem := make(chan struct{}, probeWorker)
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			for _, msg := range checkJob(bin, cfg.limit, j, st) {
				t.Errorf("memplan %s\n%s", strings.Join(j.args, " "), msg)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d jobs, %d commands in %v (seed %d): %s", len(jobs), st.commands, time.Since(start).Round(time.Second), cfg.seed, st)
}

type sweepConfig struct {
	jobs  int
	seed  uint64
	limit time.Duration
	quick bool // small models only: the normal test run's subset
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", name, s)
	}
	return n
}

// sweepStats counts commands by command and exit status ("plan 0"), and the
// slow ones.
type sweepStats struct {
	mu       sync.Mutex
	commands int
	byKey    map[string]int
	slow     []string
	refused  map[string]int // refusals, numbers blanked
	longest  []sweepTime
}

type sweepTime struct {
	took time.Duration
	args string
}

var digits = regexp.MustCompile(`\d+`)

func (s *sweepStats) add(cmd string, run sweepRun, args []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commands++
	s.longest = append(s.longest, sweepTime{run.took, strings.Join(args, " ")})
	slices.SortFunc(s.longest, func(a, b sweepTime) int { return int(b.took - a.took) })
	s.longest = s.longest[:min(len(s.longest), 5)]
	if s.commands%200 == 0 {
		fmt.Fprintf(os.Stderr, "sweep: %d commands\n", s.commands)
	}
	code := run.code
	if code == 1 {
		s.refused[digits.ReplaceAllString(strings.TrimSpace(run.stderr), "N")]++
	}
	key := fmt.Sprintf("%s exit %d", cmd, code)
	if code < 0 {
		key = cmd + " slow"
		s.slow = append(s.slow, strings.Join(args, " "))
	}
	s.byKey[key]++
}

func (s *sweepStats) String() string {
	var keys []string
	for k := range s.byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, s.byKey[k]))
	}
	out := strings.Join(parts, ", ")
	for _, c := range s.slow {
		out += "\n  slow: memplan " + c
	}
	for _, l := range s.longest {
		out += fmt.Sprintf("\n  took %v: memplan %s", l.took.Round(time.Millisecond), l.args)
	}
	for m, n := range s.refused {
		out += fmt.Sprintf("\n  refused %d×: %.200s", n, m)
	}
	return out
}

// sweepModel is one catalog model, its parameter count deciding how often
// the sweep may afford it.
type sweepModel struct {
	name      string
	params    float64
	positions int    // the longest sequence it takes
	family    string // encoders (bert, vit) only train; only MoE models take --ep
}

// sweepGPU is a GPU of the sweep: small, mid, large and MIG slices; bf16
// false for the ones without bfloat16 arithmetic.
type sweepGPU struct {
	name string
	bf16 bool
}

var sweepGPUs = []sweepGPU{
	{"t4", false}, {"rtx-4090", true}, {"l4", true}, {"a100-40gb", true}, {"l40s", true},
	{"h100-sxm", true}, {"h200", true}, {"b200", true}, {"mi300x", true},
	{"a100-40gb-mig-1g.5gb", true}, {"h100-sxm-mig-3g.40gb", true}, {"h200-mig-1g.18gb", true},
}

func loadSweepCatalog(t *testing.T, bin string, quick bool) []sweepModel {
	out, err := exec.Command(bin, "models", "--output", "json").Output()
	if err != nil {
		t.Fatalf("memplan models: %v", err)
	}
	var doc struct {
		Models []struct {
			Name      string  `json:"name"`
			Family    string  `json:"family"`
			Params    float64 `json:"params"`
			Positions int     `json:"max_positions"`
		} `json:"models"`
	}
	if err := json.Unmarshal(out, &doc); err != nil || len(doc.Models) == 0 {
		t.Fatalf("memplan models --output json: %v", err)
	}
	var ms []sweepModel
	for _, m := range doc.Models {
		if !quick || m.Params < 6e8 {
			ms = append(ms, sweepModel{m.Name, m.Params, m.Positions, m.Family})
		}
	}
	return ms
}

// A sweepJob is one command line (without --json) and the command.
type sweepJob struct {
	cmd  string
	args []string
}

// heavyFamily: the fine-grained mixtures of experts, tens of thousands of
// ops a plan (measured on this host at load 14: qwen3-30b-a3b plan --seq 128
// 31 s, deepseek-v2-lite 10 s, deepseek-v3 at seq 4096 100 s; mixtral 2 s).
var heavyFamily = map[string]bool{"qwen3_moe": true, "deepseek_v2": true, "deepseek_v3": true}

// sampleJobs draws cfg.jobs jobs; models round-robin so each is drawn, the
// heavy ones on one job in 8 of theirs.
func sampleJobs(cat []sweepModel, cfg sweepConfig) []sweepJob {
	r := rand.New(rand.NewPCG(cfg.seed, 15))
	var out []sweepJob
	for i := 0; len(out) < cfg.jobs; i++ {
		m := cat[i%len(cat)]
		if heavyFamily[m.family] && r.IntN(8) != 0 {
			continue
		}
		j := drawJob(r, m, cfg.quick)
		for i, a := range j.args[1:] {
			if n, err := strconv.Atoi(a); err == nil && m.positions > 0 && n > m.positions && (j.args[i] == "--seq" || j.args[i] == "--max-model-len") {
				j.args[i+1] = strconv.Itoa(m.positions)
			}
		}
		out = append(out, j)
	}
	return out
}

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

// drawJob draws one command over model m.
func drawJob(r *rand.Rand, m sweepModel, quick bool) sweepJob {
	cmd := pick(r, []string{"plan", "plan", "plan", "plan", "compare", "max", "diagnose", "fit"})
	g := pick(r, sweepGPUs)
	mode := pick(r, []string{"train", "train", "train", "infer", "serve"})
	if cmd != "plan" && cmd != "max" || m.family == "bert" || m.family == "vit" {
		mode = "train"
	}
	args := []string{cmd, "--model", m.name, "--gpu", g.name}
	if cmd == "plan" && r.IntN(8) == 0 {
		args = args[:3] // no GPU: fits is not decided
	}
	switch mode {
	case "serve":
		args = append(args, serveFlags(r, g)...)
	case "infer":
		args = append(args, "--mode", "infer", "--micro-batch", pick(r, []string{"1", "2", "8"}),
			"--seq", pick(r, []string{"1", "128", "1024", "4096"}), "--gen-tokens", pick(r, []string{"0", "64", "1024"}))
		args = append(args, "--precision", pick(r, precisions(g)))
	default:
		args = append(args, trainFlags(r, g, cmd, m)...)
	}
	return sweepJob{cmd: cmd, args: finishJob(r, cmd, mode, args)}
}

func precisions(g sweepGPU) []string {
	if !g.bf16 {
		return []string{"fp32", "amp-fp16", "fp16", "pure-fp16"}
	}
	return []string{"fp32", "amp-bf16", "amp-bf16", "amp-fp16", "bf16", "fp16", "pure-bf16", "pure-fp16"}
}

// sweepVariations are the strategy flags a training job draws zero to two of.
var sweepVariations = [][]string{
	{"--checkpoint", "full"}, {"--checkpoint", "every=2"}, {"--checkpoint", "selective-op"},
	{"--offload", "activations"}, {"--offload", "optimizer"}, {"--dp", "4", "--zero", "1"}, {"--dp", "4", "--zero", "2"},
	{"--dp", "8", "--zero", "3"}, {"--dp", "8", "--fsdp", "--offload", "params"}, {"--dp", "2"}, {"--tp", "2"},
	{"--tp", "2", "--sp"}, {"--pp", "2", "--accum", "4"}, {"--pp", "4", "--accum", "8", "--pp-schedule", "gpipe"},
	{"--accum", "4"}, {"--lora", "r=16,alpha=32"}, {"--lora", "r=8", "--qlora"}, {"--optimizer-impl", "fused"},
	{"--optimizer-impl", "single"}, {"--attention", "eager"}, {"--alloc-conf", "expandable_segments:True"},
	{"--fit-on", "reserved"}, {"--recipe", "deepspeed"}, {"--recipe", "torchtitan"}, {"--recipe", "litgpt"},
	{"--ep", "2", "--dp", "2"},
}

func trainFlags(r *rand.Rand, g sweepGPU, cmd string, m sweepModel) []string {
	args := []string{"--precision", pick(r, precisions(g)),
		"--optimizer", pick(r, []string{"adamw", "adamw", "sgd", "sgd-momentum", "adafactor", "adamw8bit", "lion", "adamw4bit-torchao"})}
	if cmd == "fit" {
		return append(args, "--seq", pick(r, []string{"128", "1024", "4096"}), "--gpus", pick(r, []string{"1", "2", "8"}))
	}
	args = append(args, "--micro-batch", pick(r, []string{"1", "2", "8"}), "--seq", pick(r, []string{"1", "128", "1024", "4096"}))
	for n := r.IntN(3); n > 0; n-- {
		v := pick(r, sweepVariations)
		moe := strings.Contains(m.family, "moe") || strings.Contains(m.family, "deepseek") || m.family == "mixtral"
		if v[0] == "--ep" && !moe || (v[0] == "--alloc-conf" || v[0] == "--fit-on") && cmd != "plan" {
			continue
		}
		if !slices.Contains(args, v[0]) { // one value per flag
			args = append(args, v...)
		}
	}
	return args
}

func serveFlags(r *rand.Rand, g sweepGPU) []string {
	args := []string{"--mode", "serve"}
	for n := r.IntN(3); n > 0; n-- {
		args = append(args, pick(r, [][]string{
			{"--max-model-len", pick(r, []string{"1024", "4096", "32768"})}, {"--quantization", pick(r, []string{"int8", "fp8", "awq", "gptq", "nf4"})},
			{"--kv-cache-dtype", "fp8"}, {"--enforce-eager"}, {"--tp", "2"}, {"--gpu-memory-utilization", "0.5"},
			{"--vllm-version", "0.7"}, {"--max-num-seqs", "16"},
		})...)
	}
	if !g.bf16 {
		args = append(args, "--dtype", "float16")
	}
	return args
}

// finishJob sets what only some commands have: plan's first step and
// chart, max's '?'.
func finishJob(r *rand.Rand, cmd, mode string, args []string) []string {
	switch cmd {
	case "plan":
		// Serve mode plans no first step and refuses the flag (the
		// draw is made all the same, to keep the sample's seed).
		if r.IntN(2) == 0 && mode != "serve" {
			args = append(args, "--first-step=false")
		}
	case "max":
		args = append(args, maxQuestion(r, mode, args)...)
	}
	return args
}

// maxQuestion replaces (or adds) the dimension max asks for with '?'.
func maxQuestion(r *rand.Rand, mode string, args []string) []string {
	var flag string
	switch mode {
	case "serve":
		return []string{"--requests", "?", "--context", pick(r, []string{"1024", "4096"})}
	case "infer":
		flag = pick(r, []string{"--micro-batch", "--gen-tokens"})
	default:
		flag = pick(r, []string{"--micro-batch", "--micro-batch", "--seq"})
	}
	for i := range args[:len(args)-1] {
		if args[i] == flag {
			args[i+1] = "?"
			return nil
		}
	}
	return []string{flag, "?"}
}

// sweepRun is one command's outcome; code -1: over the time limit.
type sweepRun struct {
	code           int
	took           time.Duration
	stdout, stderr string
	err            string // what is wrong with it on its own
}

func runSweepCmd(bin string, limit time.Duration, args []string) sweepRun {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	err := cmd.Run()
	run := sweepRun{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(began)}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		run.code = -1
		return run
	case errors.As(err, &ee):
		run.code = ee.ExitCode()
	case err != nil:
		run.code, run.err = -2, err.Error()
		return run
	}
	run.err = judgeRun(run)
	return run
}

var internalText = regexp.MustCompile(`panic:|goroutine \d|internal error|runtime error|\[recovered\]`)

// judgeRun says what is wrong with one command's outcome on its own.
func judgeRun(run sweepRun) string {
	text := run.stdout + run.stderr
	switch {
	case internalText.MatchString(text):
		return fmt.Sprintf("exit %d, crashed:\n%.3000s", run.code, text)
	case run.code == 1 && (run.stdout != "" || len(refusal(run.stderr)) != 1):
		return fmt.Sprintf("refusal not one line on stderr (stdout %d bytes):\n%.1500s", len(run.stdout), text)
	case run.code != 0 && run.code != 1 && run.code != 3 && run.code != 4:
		return fmt.Sprintf("exit %d:\n%.1500s", run.code, text)
	case run.code != 1:
		if msg := sane([]byte(run.stdout)); msg != "" {
			return "silently wrong: " + msg
		}
	}
	return ""
}

// checkJob runs a job in text and JSON and returns what is wrong.
func checkJob(bin string, limit time.Duration, j sweepJob, st *sweepStats) []string {
	text := runSweepCmd(bin, limit, j.args)
	st.add(j.cmd, text, j.args)
	if j.cmd == "diagnose" { // diagnose's JSON is a snapshot's; its baseline is plan's
		pj := append([]string{"plan"}, j.args[1:]...)
		return checkPair(bin, limit, j, text, runSweepCmd(bin, limit, append(pj, "--json", "--no-timeline")), st)
	}
	jargs := append(slices.Clone(j.args), "--json")
	if j.cmd == "plan" {
		jargs = append(jargs, "--no-timeline")
	}
	js := runSweepCmd(bin, limit, jargs)
	st.add(j.cmd, js, jargs)
	return checkPair(bin, limit, j, text, js, st)
}

// checkPair checks a job's text and JSON outcomes together.
func checkPair(bin string, limit time.Duration, j sweepJob, text, js sweepRun, st *sweepStats) []string {
	var bad []string
	for _, r := range []sweepRun{text, js} {
		if r.err != "" {
			bad = append(bad, r.err)
		}
	}
	if text.code < 0 || js.code < 0 || len(bad) > 0 || text.code == 1 && (js.code == 1 || j.cmd == "diagnose") {
		return bad
	}
	if text.code != js.code && j.cmd != "diagnose" {
		return []string{fmt.Sprintf("text exits %d, JSON %d:\n%.1500s", text.code, js.code, text.stdout+text.stderr)}
	}
	if j.cmd == "fit" && js.code == 4 { // no plan: one line, as a refusal (the service's 422)
		if js.stdout != "" || len(refusal(js.stderr)) != 1 {
			return []string{fmt.Sprintf("fit found no plan but did not say so in one line:\n%.1500s", js.stdout+js.stderr)}
		}
		return nil
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(js.stdout), &doc); err != nil {
		return []string{"JSON does not decode: " + err.Error()}
	}
	if msg := sameCompute(doc); msg != "" {
		bad = append(bad, msg)
	}
	if msg := eachPlan(doc, checkReserved); msg != "" {
		bad = append(bad, msg)
	}
	if msg := samePeakInText(j.cmd, text.stdout, doc); msg != "" {
		bad = append(bad, msg+"\n"+clip(text.stdout))
	}
	if msg := sameServeInText(text.stdout, doc); msg != "" {
		bad = append(bad, msg+"\n"+clip(text.stdout))
	}
	if msg := sameVerdictInText(j.cmd, text.stdout, doc); msg != "" {
		bad = append(bad, msg+"\n"+clip(text.stdout))
	}
	if msg := checkReservedLine(text.stdout); msg != "" {
		bad = append(bad, msg)
	}
	if j.cmd == "fit" {
		bad = append(bad, checkReproduce(bin, limit, doc, st)...)
	}
	return bad
}

func clip(s string) string {
	if len(s) > 2500 {
		return s[:2500] + "..."
	}
	return s
}

// eachPlan applies check to every memplan.plan/v1 document inside doc.
func eachPlan(v any, check func(map[string]any) string) string {
	switch x := v.(type) {
	case map[string]any:
		if x["schema"] == "memplan.plan/v1" {
			if msg := check(x); msg != "" {
				return msg
			}
		}
		for _, e := range x {
			if msg := eachPlan(e, check); msg != "" {
				return msg
			}
		}
	case []any:
		for _, e := range x {
			if msg := eachPlan(e, check); msg != "" {
				return msg
			}
		}
	}
	return ""
}

func f64(v any) float64 {
	f, _ := v.(float64)
	return f
}

// checkReserved: a plan's reserved peak holds its allocated bytes at that
// point and is at least the allocated peak (the cache only adds to
// what is allocated); every phase's peak is at most the plan's.
func checkReserved(plan map[string]any) string {
	peak, _ := plan["peak"].(map[string]any)
	p := f64(peak["bytes"])
	phases, _ := plan["phases"].(map[string]any)
	for name, ph := range phases {
		if m, _ := ph.(map[string]any); f64(m["peak_bytes"]) > p {
			return fmt.Sprintf("phase %s peaks at %.0f, over the peak %.0f", name, f64(m["peak_bytes"]), p)
		}
	}
	rv, ok := plan["reserved"].(map[string]any)
	if !ok {
		return ""
	}
	r, a := f64(rv["peak_bytes"]), f64(rv["allocated_at_peak_bytes"])
	switch {
	case r < a:
		return fmt.Sprintf("reserved peak %.0f under the %.0f allocated at it", r, a)
	case r < p:
		return fmt.Sprintf("reserved peak %.0f under the allocated peak %.0f", r, p)
	}
	return ""
}

var (
	reservedLine = regexp.MustCompile(`Reserved (\S+ \S+) predicted by the caching allocator \((\S+ \S+) in blocks`)
	textPeaks    = map[string]*regexp.Regexp{
		"plan":     regexp.MustCompile(`(?m)^Peak (\S+ \S+) in`),
		"compare":  regexp.MustCompile(`(?m)^│ baseline\s+│\s+(\S+ \S+) │`),
		"max":      regexp.MustCompile(`(?m)^  \S+ \d+: peak (\S+ \S+) in`),
		"fit":      regexp.MustCompile(`(?m)^  peak (\S+ \S+) in`),
		"diagnose": regexp.MustCompile(`(?m)^baseline: peak (\S+ \S+) in`),
	}
)

// jsonPeak is the peak the JSON answer reports where the text states one
// (ok false where it has none: a serve plan, max without a value, fit
// without a winner).
func jsonPeak(cmd string, doc map[string]any) (float64, bool) {
	var plan map[string]any
	switch cmd {
	case "plan", "diagnose":
		plan = doc
	case "max":
		plan, _ = doc["at"].(map[string]any)
	case "fit":
		w, ok := doc["winner"].(map[string]any)
		return f64(w["peak_bytes"]), ok
	case "compare":
		ss, _ := doc["strategies"].([]any)
		if len(ss) == 0 {
			return 0, false
		}
		s, _ := ss[0].(map[string]any)
		return f64(s["peak_bytes"]), s["strategy"] == "baseline"
	}
	peak, ok := plan["peak"].(map[string]any)
	if !ok {
		return 0, false
	}
	return f64(peak["bytes"]), true
}

// samePeakInText: the text states the JSON's peak, as units.Bytes writes it.
func samePeakInText(cmd, text string, doc map[string]any) string {
	p, ok := jsonPeak(cmd, doc)
	if !ok || doc["mode"] == "serve" {
		return ""
	}
	m := textPeaks[cmd].FindStringSubmatch(text)
	want := units.Bytes(p).String()
	switch {
	case m == nil:
		return fmt.Sprintf("the text states no peak; the JSON's is %s", want)
	case m[1] != want:
		return fmt.Sprintf("the text's peak is %s, the JSON's %s", m[1], want)
	}
	return ""
}

// checkReservedLine: the reserved peak the text states holds what its
// blocks hold.
func checkReservedLine(text string) string {
	m := reservedLine.FindStringSubmatch(text)
	if m == nil {
		return ""
	}
	r, err1 := units.ParseBytes(m[1])
	a, err2 := units.ParseBytes(m[2])
	if err1 != nil || err2 != nil || r < a {
		return fmt.Sprintf("the reserved line says %s reserved with %s in blocks", m[1], m[2])
	}
	return ""
}

// checkReproduce runs fit's reproducing command for its winner and checks
// it plans the winner's peak and fits.
func checkReproduce(bin string, limit time.Duration, doc map[string]any, st *sweepStats) []string {
	w, ok := doc["winner"].(map[string]any)
	if !ok {
		return nil
	}
	cmd, _ := w["command"].(string)
	words, err := splitWords(cmd)
	if err != nil || len(words) < 2 || words[0] != "memplan" {
		return []string{fmt.Sprintf("fit's winner command %q is not a memplan command", cmd)}
	}
	args := append(words[1:], "--json", "--no-timeline")
	run := runSweepCmd(bin, limit, args)
	st.add("fit-reproduce", run, args)
	if run.code < 0 {
		return nil
	}
	if run.err != "" || run.code != 0 {
		return []string{fmt.Sprintf("fit's winner does not plan as fitting (exit %d): %s\n%.1500s", run.code, cmd, run.err+run.stdout+run.stderr)}
	}
	var plan map[string]any
	_ = json.Unmarshal([]byte(run.stdout), &plan)
	if p, _ := jsonPeak("plan", plan); p != f64(w["peak_bytes"]) {
		return []string{fmt.Sprintf("fit's winner peaks at %.0f, its command %s at %.0f", f64(w["peak_bytes"]), cmd, p)}
	}
	return nil
}

// sameCompute: compare's strategies that move memory without recomputing
// (activations offloaded, the batch split into more micro-steps) add no
// FLOPs to the step.
func sameCompute(doc map[string]any) string {
	ss, _ := doc["strategies"].([]any)
	for _, e := range ss {
		s, _ := e.(map[string]any)
		name, _ := s["strategy"].(string)
		if r := f64(s["extra_flops_ratio"]); (strings.HasPrefix(name, "offload activations") || strings.HasPrefix(name, "accumulate")) && (r > 1e-9 || r < -1e-9) {
			return fmt.Sprintf("compare's %q changes the step's FLOPs by %+.2f%%", name, 100*r)
		}
	}
	return ""
}

var (
	fitsLine  = regexp.MustCompile(`(?m)^Fits on .* \((\S+ \S+) usable\): (\S+ \S+) to spare`)
	shortLine = regexp.MustCompile(`(?m)^DOES NOT FIT on .* \((\S+ \S+) usable\): needs (\S+ \S+) more`)
)

// sameVerdictInText: plan's text states the JSON's verdict, capacity and
// headroom or shortfall.
func sameVerdictInText(cmd, text string, doc map[string]any) string {
	if cmd != "plan" || doc["schema"] != "memplan.plan/v1" || f64(doc["capacity_bytes"]) == 0 {
		return ""
	}
	fits, _ := doc["fits"].(bool)
	c := units.Bytes(f64(doc["capacity_bytes"])).String()
	m, want := fitsLine.FindStringSubmatch(text), units.Bytes(f64(doc["headroom_bytes"])).String()
	if f64(doc["shortfall_bytes"]) > 0 {
		m, want = shortLine.FindStringSubmatch(text), units.Bytes(f64(doc["shortfall_bytes"])).String()
	}
	switch {
	case m == nil && (fits || f64(doc["shortfall_bytes"]) > 0):
		return fmt.Sprintf("the text states no verdict; the JSON's: fits %v, capacity %s", fits, c)
	case m != nil && (m[1] != c || m[2] != want):
		return fmt.Sprintf("the text says %q; the JSON's capacity is %s, headroom or shortfall %s", m[0], c, want)
	}
	return ""
}

// sameServeInText: a serving plan's text states the JSON's KV blocks and
// concurrent requests.
func sameServeInText(text string, doc map[string]any) string {
	if doc["schema"] != "memplan.serve/v1" {
		return ""
	}
	for _, want := range []string{
		fmt.Sprintf("# GPU blocks: %.0f ", f64(doc["gpu_blocks"])),
		fmt.Sprintf("Concurrent requests of %.0f tokens: %.0f\n", f64(doc["context"]), f64(doc["requests_at_context"])),
	} {
		if !strings.Contains(text, want) {
			return fmt.Sprintf("the serving text lacks the JSON's %q", strings.TrimSpace(want))
		}
	}
	return ""
}
