package search

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// DefaultMemoryBudget is Options.MemoryBudget's default: 1 GiB of live
// programs and plans. fit --model mixtral-8x7b --gpu a100-40gb --gpus 64
// --global-batch 512 --seq 4096 --allow lora,qlora,8bit,precision (135,072
// candidates, BenchmarkFitMixtralAllow) searches inside it.
const DefaultMemoryBudget units.Bytes = 1 << 30

// ErrMemoryBudget is wrapped by the error of a search that would hold more
// than its memory budget live.
var ErrMemoryBudget = errors.New("over the search's memory budget")

// BudgetError is a search over its memory budget Total: its Candidates
// plans alone hold Held (over a quarter of Total), or, with Plan set,
// planning Plan holds Held of program, over a worker's Share. Error says
// it in the search's words; the command line names its flags.
type BudgetError struct {
	Total       units.Bytes
	Candidates  int
	Plan        string
	Held, Share units.Bytes
}

func (e *BudgetError) Error() string {
	if e.Plan == "" {
		return fmt.Sprintf("%v: its %d candidate plans alone take %s, over a quarter of the budget %s (pin dimensions of the search, leave a family out, or raise the budget)",
			ErrMemoryBudget, e.Candidates, e.Held, e.Total)
	}
	return fmt.Sprintf("%v: planning %s holds %s of program, over a worker's share %s of the budget %s (raise the budget)",
		ErrMemoryBudget, e.Plan, e.Held, e.Share, e.Total)
}

// Unwrap makes errors.Is(err, ErrMemoryBudget) hold.
func (e *BudgetError) Unwrap() error { return ErrMemoryBudget }

// opBytes is what one cached op costs on the heap with its tensors, operand
// lists and shapes, for sizing the program caches in ops (engine.Cache.Limit):
// measured by resultBytes on the shallow programs of a mixtral-8x7b search
// (329-406 B per op on mixtral-8x7b, llama-3.2-1b and gpt2, sharded or not;
// TestOpBytesMeasured holds it within a factor of two).
const opBytes = 400

// budget splits Options.MemoryBudget between the candidate plans, each
// worker's program cache and each worker's plan in flight, and records the
// first plan whose program alone is over a worker's share.
type budget struct {
	total     units.Bytes
	perWorker units.Bytes // a worker's cache, and again its plan in flight
	mu        sync.Mutex
	err       error
}

// newBudget divides total among workers after the candidates' share; a
// search whose candidate plans alone take over a quarter of it is refused.
func newBudget(total units.Bytes, workers, candidates int) (*budget, error) {
	cands := units.Bytes(candidates) * units.Bytes(unsafe.Sizeof(Plan{}))
	if cands > total/4 {
		return nil, &BudgetError{Total: total, Candidates: candidates, Held: cands}
	}
	return &budget{total: total, perWorker: (total - cands) / units.Bytes(2*max(workers, 1))}, nil
}

// cacheOps is the engine.Cache.Limit of one worker's cache.
func (b *budget) cacheOps() int { return int(b.perWorker / opBytes) }

// check records an error when r's program is over a worker's share (the
// search then stops, Fit returns it); it says whether r is inside.
func (b *budget) check(s *engine.Spec, r *engine.Result) bool {
	n := resultBytes(r)
	if n <= b.perWorker {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil {
		p := Plan{Spec: *s}
		b.err = &BudgetError{Total: b.total, Plan: p.Describe(), Held: n, Share: b.perWorker}
	}
	return false
}

// failed is the first budget error (nil: none).
func (b *budget) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// resultBytes is the heap r's programs, timelines and per-op timings hold:
// the arrays' capacities and each op's operand lists and each tensor's
// shape. Names are left out (most are shared with the model's graph).
func resultBytes(r *engine.Result) units.Bytes {
	n := programBytes(r.Program) + programBytes(r.FirstProgram)
	for _, s := range []*sim.Result{r.Sim, r.First} {
		if s != nil {
			n += units.Bytes(cap(s.Timeline))*units.Bytes(unsafe.Sizeof(sim.Point{})) + units.Bytes(cap(s.Totals))*units.Bytes(unsafe.Sizeof(units.Bytes(0)))
		}
	}
	if r.Timing != nil {
		n += units.Bytes(cap(r.Timing.Ops)) * units.Bytes(unsafe.Sizeof(cost.OpTime{}))
	}
	return n
}

func programBytes(p *ir.Program) units.Bytes {
	if p == nil {
		return 0
	}
	n := units.Bytes(cap(p.Ops))*units.Bytes(unsafe.Sizeof(ir.Op{})) + units.Bytes(cap(p.Tensors))*units.Bytes(unsafe.Sizeof(ir.Tensor{}))
	for i := range p.Ops {
		n += units.Bytes(cap(p.Ops[i].In)+cap(p.Ops[i].Out)) * units.Bytes(unsafe.Sizeof(ir.TensorID(0)))
	}
	for i := range p.Tensors {
		n += units.Bytes(cap(p.Tensors[i].Shape)) * 8
	}
	return n
}
