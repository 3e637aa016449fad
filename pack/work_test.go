package pack

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
)

// A job file past the processes or the work pack takes is refused in one
// line naming the file and the limit, before anything is planned; at the
// limits it is read.
func TestReadFileRefusesPastLimits(t *testing.T) {
	dir := t.TempDir()
	n := 0
	file := func(jobs ...string) string {
		n++
		if err := os.Mkdir(filepath.Join(dir, fmt.Sprint(n)), 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, fmt.Sprint(n), "jobs.yaml")
		if err := os.WriteFile(p, []byte("kind: memplan.jobs/v1\njobs:\n"+strings.Join(jobs, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rep := func(name string, n int, train string) string {
		return fmt.Sprintf("  - {name: %s, replicas: %d, train: %s}\n", name, n, train)
	}
	var heavy []string
	for i := range 8 { // the eight deepseek-v3 jobs that took 3.5 GB and 30 s
		heavy = append(heavy, rep(fmt.Sprint("j", i), 1, fmt.Sprintf("{model: deepseek-v3, seq: %d, accum: 8}", 64+i)))
	}
	for _, tc := range []struct {
		name string
		path string
		want string
	}{
		{"4 × 1024 replicas", file(rep("a", 1024, "{model: gpt2}"), rep("b", 1024, "{model: gpt2, seq: 256}"), rep("c", 1024, "{model: gpt2, seq: 512}"), rep("d", 1024, "{model: gpt2, seq: 64}")),
			"jobs.yaml: 4096 processes (each job's replicas × its GPUs), more than pack's 1024"},
		{"replicas of a gang", file(rep("a", 33, "{model: gpt2, dp: 32}")), "jobs.yaml: 1056 processes"},
		{"services of several GPUs", file("  - {name: s, replicas: 600, serve: {model: gpt2, concurrency: 1, context: 8, tp: 2}}\n"), "jobs.yaml: 1200 processes"},
		{"eight deepseek-v3 at accum 8", file(heavy...),
			"jobs.yaml: the jobs' iterations come to about 11.4 million ops to plan and replay, more than pack's 4 million (a deepseek-v3 job is 0.5 million, 1.4 million at accum 3 or more; a pipeline's stages count each the micro-steps they simulate): split the file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFile(tc.path)
			checkBad(t, err, tc.want)
		})
	}
	for _, p := range []string{file(rep("a", 1024, "{model: gpt2}")), file(rep("a", 32, "{model: gpt2, dp: 32}")), file(heavy[:2]...)} {
		if _, err := ReadFile(p); err != nil {
			t.Errorf("at the limits: %v", err)
		}
	}
}

// workOf follows the engine's ops: within a fifth of each program's (the
// steady iteration's; the first has the same ops) for dense and
// mixture-of-experts models, at one, two and eight micro-steps.
func TestWorkFollowsOps(t *testing.T) {
	for _, train := range []string{"{model: gpt2}", "{model: llama-3-8b, seq: 64}", "{model: mixtral-8x7b, seq: 64}", "{model: qwen3-30b-a3b, seq: 64}", "{model: llama-3-8b, seq: 64, accum: 2}", "{model: gpt2, accum: 8}"} {
		f, err := Parse([]byte("kind: memplan.jobs/v1\njobs: [{name: a, train: "+train+"}]"), "jobs.yaml")
		if err != nil {
			t.Fatal(err)
		}
		s, err := f.Jobs[0].Train.Spec()
		if err != nil {
			t.Fatal(err)
		}
		res, err := engine.Plan(s)
		if err != nil {
			t.Fatal(err)
		}
		ops, est := int64(len(res.Program.Ops)), workOf(&f.Jobs[0])
		t.Logf("%s: %d ops, estimated %d", train, ops, est)
		if est < ops*4/5 || est > ops*6/5 {
			t.Errorf("%s: %d ops, estimated %d", train, ops, est)
		}
	}
}

// A pipeline's work is every stage's: the micro-steps each simulates (all
// of them under GPipe and interleaving) times the layers it is built from
// (the whole model for an interleaved stage; past engine.MaxPipelineWork
// the engine refuses the job), and a 1F1B pipeline past 2p+3 micro-steps
// (p+1 and p+2 a stage) counts those.
func TestWorkCountsPipelineStages(t *testing.T) {
	work := func(train string) int64 {
		f, err := Parse([]byte("kind: memplan.jobs/v1\njobs: [{name: a, train: "+train+"}]"), "jobs.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return workOf(&f.Jobs[0])
	}
	if w, want := work("{model: llama-3-8b, pp: 8, pp-interleave: 4, accum: 128}"), int64(8*128*32*84); w != want {
		t.Errorf("interleaved over 128 micro-steps: work %d, want %d (each stage the whole model)", w, want)
	}
	if w, want := work("{model: gpt2, pp: 2, pp-schedule: gpipe, accum: 1024}"), int64(2*1024*6*84); w != want {
		t.Errorf("GPipe of gpt2 over 2 stages and 1024 micro-steps: work %d, want %d", w, want)
	}
	if w, want := work("{model: llama-3-8b, pp: 8, accum: 1024}"), int64(8*(9+10)*4*84); w != want {
		t.Errorf("1F1B of llama-3-8b over 8 stages and 1024 micro-steps: work %d, want %d", w, want)
	}
}
