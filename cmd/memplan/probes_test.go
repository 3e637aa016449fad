package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A probe is one line of testdata/probes/*.txt, issue 15's adversarial
// corpus (gen.py writes flags.txt and files.txt; repro.txt is the issue's
// own reproductions): the command's arguments and the outcome it must have.
// Every probe ends within probeTime and probeRSS without a panic; a refusal
// (exit 1) is one line holding want; an answer (exit 0, 3 or 4) holds want
// and passes sane.
type probe struct {
	file string
	line int
	code int // exitServes: still serving after serveGrace
	// open: a defect another change is fixing (repro.txt names the
	// item): run and logged, not failed.
	open bool
	want string
	args []string
}

const (
	probeTime   = 10 * time.Second
	probeRSS    = 2 << 30
	serveGrace  = 2 * time.Second
	exitServes  = -1
	probeWorker = 2
)

func TestProbes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds memplan and runs it per probe")
	}
	if runtime.GOOS != "linux" {
		t.Skip("measures each probe's peak RSS through Linux's rusage")
	}
	probes, err := loadProbes("../../testdata/probes")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	bin := filepath.Join(root, "memplan")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir, made := setupProbes(t, root)
	testdata, err := filepath.Abs("../../testdata")
	if err != nil {
		t.Fatal(err)
	}
	sub := strings.NewReplacer("{testdata}", testdata, "{dir}", dir)
	start := time.Now()
	// At most probeWorker probes at once: each is measured for time and
	// memory, which a crowded machine would distort. A probe past its time
	// beside another runs again alone (the write lock) and is judged on
	// that run: the bound is the probe's, not its neighbour's. An open one
	// too, so the log says when it would pass as a closed one does
	// (judged beside another, every open probe over 10 s looked over it).
	sem := make(chan struct{}, probeWorker)
	var alone sync.RWMutex
	var wg sync.WaitGroup
	var mu sync.Mutex
	var runs []probeRun
	for _, p := range probes {
		args := make([]string, len(p.args))
		for i, a := range p.args {
			args[i] = sub.Replace(a)
		}
		want := sub.Replace(p.want)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			alone.RLock()
			r := runProbe(bin, dir, p.code, want, args)
			alone.RUnlock()
			if r.slow {
				alone.Lock()
				r = runProbe(bin, dir, p.code, want, args)
				r.rerun = true
				alone.Unlock()
			}
			r.p = p
			mu.Lock()
			runs = append(runs, r)
			mu.Unlock()
			report(t, p, r)
		}()
	}
	wg.Wait()
	byCode := map[int]int{}
	for _, p := range probes {
		byCode[p.code]++
	}
	t.Logf("%d probes in %v: %d refused (exit 1), %d answered and checked for sanity (exit 0: %d, 3: %d, 4: %d), %d served",
		len(probes), time.Since(start).Round(time.Second), byCode[1], byCode[0]+byCode[3]+byCode[4], byCode[0], byCode[3], byCode[4], byCode[exitServes])
	logSlowest(t, runs, 8)
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		if !slices.Contains(made, e.Name()) {
			left = append(left, e.Name())
		}
	}
	if len(left) > 0 {
		t.Errorf("files left in the probes' directory: %v", left)
	}
}

// probeRun is one probe's outcome: what is wrong with it ("" for nothing),
// what memplan said when it refused, and what it took.
type probeRun struct {
	p        probe
	problems string
	said     string
	took     time.Duration
	rssMiB   int64
	slow     bool // over probeTime, or killed at it
	rerun    bool // measured again alone
}

func report(t *testing.T, p probe, r probeRun) {
	cmdline := "memplan " + strings.Join(p.args, " ")
	if r.said != "" && os.Getenv("MEMPLAN_PROBES_SAID") != "" {
		// MEMPLAN_PROBES_SAID=1 with -v lists every refusal, to read them
		// for clarity.
		t.Logf("%s:%d: %s\n\t%s", p.file, p.line, cmdline, r.said)
	}
	switch {
	case p.open && r.problems == "":
		t.Logf("%s:%d: open probe now passes (%.2fs, %d MiB%s): drop its open: (%s)", p.file, p.line, r.took.Seconds(), r.rssMiB, aloneNote(r), cmdline)
	case p.open:
		t.Logf("%s:%d: open: %s\n%.300s (%.2fs, %d MiB%s)", p.file, p.line, cmdline, r.problems, r.took.Seconds(), r.rssMiB, aloneNote(r))
	case r.problems != "" && r.rerun:
		t.Errorf("%s:%d: %s\n%s (run alone, after it was slow beside another probe)", p.file, p.line, cmdline, r.problems)
	case r.problems != "":
		t.Errorf("%s:%d: %s\n%s", p.file, p.line, cmdline, r.problems)
	}
}

// aloneNote is ", run alone" for a probe measured again alone.
func aloneNote(r probeRun) string {
	if r.rerun {
		return ", run alone"
	}
	return ""
}

// logSlowest names the n slowest probes that are not open, with their time
// and peak RSS: the margin to the bounds, read in CI's log.
func logSlowest(t *testing.T, runs []probeRun, n int) {
	var closed []probeRun
	for _, r := range runs {
		if !r.p.open && r.p.code != exitServes {
			closed = append(closed, r)
		}
	}
	slices.SortFunc(closed, func(a, b probeRun) int { return cmp.Compare(b.took, a.took) })
	for _, r := range closed[:min(n, len(closed))] {
		t.Logf("slow: %5.2fs %5d MiB%s  %s:%d: memplan %s", r.took.Seconds(), r.rssMiB, aloneNote(r), r.p.file, r.p.line, strings.Join(r.p.args, " "))
	}
}

// runProbe runs one probe and says what is wrong with its outcome and, when
// memplan refused it, what memplan said.
func runProbe(bin, dir string, code int, want string, args []string) probeRun {
	limit := probeTime
	if code == exitServes {
		limit = serveGrace
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	// ulimit -v stops a probe that runs away (8 GiB of address space: Go
	// reserves more than it touches); RSS is checked below.
	cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", `ulimit -v 8388608 2>/dev/null; exec "$0" "$@"`, bin}, args...)...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	err := cmd.Run()
	r := probeRun{took: time.Since(began)}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.rssMiB = ru.Maxrss / 1024
	}
	text := stdout.String() + stderr.String()
	if code == exitServes {
		if ctx.Err() == nil {
			r.problems = fmt.Sprintf("exited (%v) instead of serving:\n%.1000s", err, text)
		}
		return r
	}
	if ctx.Err() != nil {
		r.problems, r.slow = fmt.Sprintf("still running after %v (hung or too slow)", probeTime), true
		return r
	}
	got := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		got = ee.ExitCode()
	} else if err != nil {
		r.problems = err.Error()
		return r
	}
	if got == 1 {
		r.said = strings.Join(refusal(stderr.String()), "\n\t")
	}
	bad := outcome(got, code, want, text, stdout.Bytes(), stderr.String())
	if r.rssMiB<<20 > probeRSS {
		bad = append(bad, fmt.Sprintf("peak RSS %d MiB, over %d MiB", r.rssMiB, probeRSS>>20))
	}
	if r.took > probeTime {
		bad, r.slow = append(bad, fmt.Sprintf("took %v", r.took)), true
	}
	r.problems = strings.Join(bad, "\n")
	return r
}

// outcome checks an ended probe's exit code, output and sanity.
func outcome(got, code int, want, text string, stdout []byte, stderr string) []string {
	var bad []string
	if got != code || !strings.Contains(text, want) {
		bad = append(bad, fmt.Sprintf("exit %d, want %d with %q; output:\n%.1500s", got, code, want, text))
	}
	if strings.Contains(text, "panic:") || strings.Contains(text, "goroutine ") {
		bad = append(bad, fmt.Sprintf("panicked:\n%.2000s", text))
	}
	if got == 1 && (len(stdout) > 0 || len(refusal(stderr)) != 1) {
		bad = append(bad, fmt.Sprintf("refusal not one line on stderr (stdout %d bytes):\n%.1500s", len(stdout), text))
	}
	if got != 1 {
		if msg := sane(stdout); msg != "" {
			bad = append(bad, "silently wrong: "+msg)
		}
	}
	return bad
}

// loadProbes reads every *.txt of dir: `EXIT WANT ARGS...` per line,
// shell-quoted, # comments.
func loadProbes(dir string) ([]probe, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no probes in %s: %v", dir, err)
	}
	var out []probe
	for _, f := range files {
		ps, err := readProbes(f)
		if err != nil {
			return nil, err
		}
		out = append(out, ps...)
	}
	return out, nil
}

func readProbes(path string) ([]probe, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []probe
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		w, err := splitWords(line)
		if err != nil || len(w) < 3 {
			return nil, fmt.Errorf("%s:%d: want EXIT WANT ARGS... (%v)", path, n, err)
		}
		p := probe{file: filepath.Base(path), line: n, want: w[1], args: w[2:]}
		w[0], p.open = strings.CutPrefix(w[0], "open:")
		if w[0] == "serves" {
			p.code = exitServes
		} else if p.code, err = strconv.Atoi(w[0]); err != nil {
			return nil, fmt.Errorf("%s:%d: exit %q", path, n, w[0])
		}
		out = append(out, p)
	}
	return out, sc.Err()
}

// splitWords splits a line as a POSIX shell does words: blanks separate,
// '...' is literal, "..." and \ escape.
func splitWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, cur.String()), false
				cur.Reset()
			}
			continue
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errors.New("unterminated '")
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case c == '"':
			j := strings.IndexByte(s[i+1:], '"')
			if j < 0 {
				return nil, errors.New(`unterminated "`)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		default:
			cur.WriteByte(c)
		}
		inWord = true
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// refusal is the output's lines but warnings.
func refusal(text string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if !strings.HasPrefix(l, "memplan: warning:") {
			out = append(out, l)
		}
	}
	return out
}

// badText is what an answer in words must not say: a size, share or time
// that is not a number or is negative (issue 15: "-8388608.00 TiB with NaN%
// headroom", "+NaN%").
// (A saving is written with U+2212, "−949.40 MiB"; a wrapped size with '-'.)
// A minus inside a name (a100-40gb-mig-1g.5gb) is no sign.
var badText = regexp.MustCompile(`(?i)\b(nan|[+-]?inf)\b|(^|[^\w.-])-\d[\d.,]*\s?([KMGTPE]i?B|bytes)\b`)

// sane says what is wrong with an answer ("" for nothing): JSON has no
// negative or non-finite size, count or time, and a plan's peak is its
// ledger's sum, at least every phase's peak, and fits only within the
// capacity; text has no NaN, Inf or negative size.
func sane(out []byte) string {
	trim := bytes.TrimSpace(out)
	if len(trim) == 0 || trim[0] != '{' {
		if m := badText.Find(out); m != nil {
			return fmt.Sprintf("the answer says %q", m)
		}
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(trim))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return "JSON does not decode: " + err.Error()
	}
	if msg := walkSizes("", doc, false); msg != "" {
		return msg
	}
	if doc["schema"] == "memplan.plan/v1" {
		return samePlan(doc)
	}
	return ""
}

// sizeKey: a field that counts bytes, FLOPs, parameters or seconds.
func sizeKey(k string) bool {
	return strings.Contains(k, "bytes") || strings.Contains(k, "flops") || k == "params" || strings.HasSuffix(k, "_s")
}

// walkSizes checks every number under a size key (or inside a ledger-like
// map, all) is finite, >= 0 and at most 2^62 bytes' worth.
func walkSizes(path string, v any, all bool) string {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			// A delta (compare's peak_delta_bytes; its extra_flops, negative
			// when a strategy recomputes less than the job as given) may be
			// negative, and so may a margin (pack's margin_bytes of a GPU
			// a policy overcommits, its status oom).
			delta := strings.Contains(k, "delta") || strings.HasPrefix(k, "extra_") || strings.Contains(k, "margin")
			inner := (all || sizeKey(k) || k == "ledger" || k == "model_states" || k == "by_module") && !delta
			if msg := walkSizes(path+"."+k, e, inner); msg != "" {
				return msg
			}
		}
	case []any:
		for i, e := range x {
			if msg := walkSizes(fmt.Sprintf("%s[%d]", path, i), e, all); msg != "" {
				return msg
			}
		}
	case json.Number:
		f, err := x.Float64()
		if all && (err != nil || math.IsNaN(f) || f < 0 || f > 1<<62) {
			return fmt.Sprintf("%s = %s", path, x)
		}
	}
	return ""
}

func num(v any) float64 {
	n, _ := v.(json.Number)
	f, _ := n.Float64()
	return f
}

// samePlan checks a plan's peak against its ledger, phases and capacity.
func samePlan(doc map[string]any) string {
	peak, _ := doc["peak"].(map[string]any)
	p := num(peak["bytes"])
	if ledger, ok := doc["ledger"].(map[string]any); ok {
		var sum float64
		for _, v := range ledger {
			sum += num(v)
		}
		if sum != p {
			return fmt.Sprintf("peak %.0f is not its ledger's sum %.0f", p, sum)
		}
	}
	phases, _ := doc["phases"].(map[string]any)
	for name, ph := range phases {
		if m, _ := ph.(map[string]any); num(m["peak_bytes"]) > p {
			return fmt.Sprintf("phase %s peaks at %.0f, over the peak %.0f", name, num(m["peak_bytes"]), p)
		}
	}
	decided := p
	if r, ok := doc["reserved"].(map[string]any); ok && r["decides_fit"] == true {
		decided = num(r["peak_bytes"])
	}
	c := num(doc["capacity_bytes"])
	if fits, ok := doc["fits"].(bool); ok && c > 0 {
		if fits && decided > c || !fits && decided <= c && num(doc["host_peak_bytes"]) == 0 {
			return fmt.Sprintf("fits %v with a deciding peak of %.0f on %.0f bytes", fits, decided, c)
		}
	}
	return ""
}

// setupProbes writes the probes' files into root/probes and returns it with
// the names it made; nothing else may be left in it after the probes.
//
//	moe.json      the 300-byte Mixtral config.json of 4096 layers × 4096 experts, hidden 64
//	big/          a config.json of 2 MiB (over the 1 MiB cap)
//	fifo, pipe.svg  named pipes
//	empty, adir/, loop (a symbolic link to itself), trunc.json, trunc.yaml,
//	huge (100 MB, sparse), junk (binary), nul.json (JSON with a NUL)
//	jobs.yaml     a valid two-job pack file
//	d.EXT, p.EXT, l.EXT, full.EXT (EXT svg, png, json): bad destinations,
//	a directory, a named pipe, a link to itself and a link to /dev/full
func setupProbes(t *testing.T, root string) (string, []string) {
	dir := filepath.Join(root, "probes")
	for _, d := range []string{"big", "adir"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"moe.json":        `{"model_type":"mixtral","hidden_size":64,"intermediate_size":64,"num_hidden_layers":4096,"num_attention_heads":4,"num_key_value_heads":4,"vocab_size":100,"num_local_experts":4096,"num_experts_per_tok":2,"max_position_embeddings":512,"rms_norm_eps":1e-5}`,
		"big/config.json": `{"model_type":"llama","pad":"` + strings.Repeat("x", 2<<20) + `"}`,
		"empty":           "",
		"trunc.json":      `{"model_type": "llama", "hidden_size": 4096, "num_hidden`,
		"trunc.yaml":      "kind: memplan.jobs/v1\njobs:\n  - name: a\n    train: {model: gpt2, seq: [1,",
		"junk":            "\x7fELF\x02\x01\x01\x00\xff\xfe\xfd\x00\x00\x80\x81PK\x03\x04" + strings.Repeat("\xde\xad\xbe\xef", 256),
		"nul.json":        "{\"model_type\": \"gpt2\x00\", \"n_layer\": 2}",
		"jobs.yaml":       "kind: memplan.jobs/v1\njobs:\n  - name: a\n    train: {model: gpt2, seq: 128}\n  - name: b\n    train: {model: gpt2, seq: 256}\n    replicas: 2\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Truncate(filepath.Join(dir, "empty"), 0); err != nil {
		t.Fatal(err)
	}
	huge, err := os.Create(filepath.Join(dir, "huge"))
	if err == nil {
		err = errors.Join(huge.Truncate(100<<20), huge.Close())
	}
	fifos := []string{"fifo", "pipe.svg"}
	links := map[string]string{"loop": "loop"}
	for _, ext := range []string{"svg", "png", "json"} {
		err = errors.Join(err, os.Mkdir(filepath.Join(dir, "d."+ext), 0o755))
		fifos = append(fifos, "p."+ext)
		links["l."+ext], links["full."+ext] = "l."+ext, "/dev/full"
	}
	for name, to := range links {
		err = errors.Join(err, os.Symlink(to, filepath.Join(dir, name)))
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fifos {
		if err := syscall.Mkfifo(filepath.Join(dir, f), 0o644); err != nil {
			t.Skip("no named pipes:", err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var made []string
	for _, e := range ents {
		made = append(made, e.Name())
	}
	return dir, made
}
