package pack

import "github.com/memplan/memplan/engine"

// Limits on what one job file makes pack do, each refused before anything
// is planned, in one line naming the file and the limit.
const (
	// maxProcesses bounds the processes of a job file: every job's
	// replicas × its GPUs. A process is an envelope with three curves, and
	// under whole-gpu a GPU of its own with two combined curves in every
	// policy's assignment: about 280 KB of JSON each, so 4 jobs of 1,024
	// replicas on 4096 H100s wrote 1.14 GB (8.3 s, 2.79 GB of memory);
	// 1,024 processes write 290 MB in 2 s and 1 GB.
	maxProcesses = 1024
	// maxWork bounds the ops the job file's iterations take to plan and
	// replay through the allocator (workOf, summed over the jobs, replicas
	// planned once): 4 million, two deepseek-v3 jobs at accum 8 (1.4
	// million ops each, about 20 s and 1.5 GB apiece here: its limit is
	// bisected over a dozen replays of its iterations). Eight of them took
	// 3.5 GB and more than 30 s.
	maxWork = 4_000_000
)

// workOf is about how many ops job j's iterations take to plan
// (engine.Work of its spec; the ranks of a stage are planned once, a
// pipeline's stages each with the micro-steps and layers engine.StageWork
// says: a GPipe or interleaved schedule simulates every micro-step, and an
// interleaved stage is built from the whole model, llama-3-8b --pp 8
// --pp-interleave 4 --accum 1024 passed as 0.1 million ops when counted as
// three micro-steps of the model, and took 46 s). A vLLM service, a plan
// JSON and a snapshot are read, not planned: 0.
func workOf(j *Job) int64 {
	var s engine.Spec
	var err error
	switch {
	case j.Train != nil:
		s, err = j.Train.Spec()
	case j.Serve != nil && j.Serve.server() == "hf":
		s, err = j.Serve.Spec()
	case j.pubSpec != nil:
		s = *j.pubSpec
	default:
		return 0
	}
	if err != nil {
		return 0
	}
	return engine.Work(&s, true) // priced on the pool's GPU
}

// ranksOf is how many GPUs job j runs on (one process each).
func ranksOf(j *Job) int {
	var s engine.Spec
	var err error
	switch {
	case j.Train != nil:
		s, err = j.Train.Spec()
	case j.Serve != nil && j.Serve.server() == "vllm":
		return max(j.Serve.TP, 1)
	case j.Serve != nil:
		s, err = j.Serve.Spec()
	case j.pubSpec != nil:
		s = *j.pubSpec
	default:
		return 1
	}
	if err != nil {
		return 1
	}
	return s.JobGPUs()
}

// checkWork refuses jobs (of the file name) past maxProcesses or maxWork.
func checkWork(name string, jobs []Job) error {
	var procs, work int64
	for i := range jobs {
		procs += int64(jobs[i].replicas()) * int64(ranksOf(&jobs[i]))
		work += workOf(&jobs[i])
	}
	if procs > maxProcesses {
		return bad(name, "%d processes (each job's replicas × its GPUs), more than pack's %d", procs, maxProcesses)
	}
	if work > maxWork {
		return bad(name, "the jobs' iterations come to about %.1f million ops to plan and replay, more than pack's %d million (a deepseek-v3 job is 0.5 million, 1.4 million at accum 3 or more; a pipeline's stages count each the micro-steps they simulate): split the file",
			float64(work)/1e6, maxWork/1_000_000)
	}
	return nil
}
