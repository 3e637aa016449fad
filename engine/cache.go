package engine

import (
	"sync"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/plan"
	"github.com/memplan/memplan/strategy"
)

// Cache memoizes the part of planning that sharding and offload do not
// change: a stage's program after lowering, checkpointing and the pipeline
// schedule. Searches that vary ZeRO stage, data-parallel degree or offload
// over the same model, micro-batch and schedule then build, lower and
// schedule each stage once. The lowered program itself is cached too, so
// the checkpoint policies of one micro-batch lower it once. A Cache is safe for concurrent use; cached
// programs are never modified (strategy.Transform must not modify its
// input), so a plan with a Cache equals one without. It holds at most
// about Limit ops' worth of programs (default 512Ki), and empties when full.
type Cache struct {
	Limit int

	mu           sync.Mutex
	m            map[cacheKey]*cacheEntry
	size         int
	hits, misses int
}

// Stats counts the lookups that found a program and those that did not.
func (c *Cache) Stats() (hits, misses int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.misses
}

type cacheEntry struct {
	prog   *ir.Program
	params int64
}

// cacheKey is every Spec field the program before sharding depends on.
type cacheKey struct {
	model              *models.Arch
	micro, seq, accum  int
	prec               ops.Precision
	opt                plan.Optimizer
	impl               plan.Impl
	attn               build.Attention
	dev                ops.Device
	first              bool
	ckpt               string
	tp, ep             int
	sp                 bool
	lora               *build.LoRA
	qlora              bool
	pp, interleave, st int
	sched              string
	wholeStages        bool
	sem                Semantics
	// flat: the graph is built for FSDP1 FlatParameters (Spec.flatParams),
	// which depends on the ZeRO stage.
	flat bool
	// lowered marks the lowered program, before checkpointing (ckpt is
	// empty).
	lowered bool
	// Set for a sharded program: the ZeRO stage (-1: DDP), the
	// data-parallel degree and ZeRO-2's bucket.
	zero, dp int
	bucket   int64
}

// cacheKey is s's key for stage stage, and whether its program may be
// cached (catalog training without auto checkpointing, whose choice
// depends on more than the key).
func (s *Spec) cacheKey(first bool, stage int) (cacheKey, bool) {
	if s.Cache == nil || s.Trace != nil || s.Model == nil || s.Mode != Train || s.Checkpoint.Kind == "auto" {
		return cacheKey{}, false
	}
	return cacheKey{model: s.Model, micro: s.MicroBatch, seq: s.Seq, accum: s.Accum, prec: s.Precision, opt: s.Optimizer,
		impl: s.Impl, attn: s.Attention, dev: s.Device, first: first, ckpt: s.Checkpoint.String(), tp: s.TP, ep: s.EP,
		sp: s.SP, lora: s.LoRA, qlora: s.QLoRA, pp: s.PP, interleave: s.PPInterleave, st: stage, sched: s.PPSchedule,
		wholeStages: s.wholeStages, sem: s.Sem, flat: s.flatParams()}, true
}

// DropSharded forgets the sharded programs (keeping those before
// sharding): a search that has moved on to another ZeRO stage or
// data-parallel degree will not ask for them again.
func (c *Cache) DropSharded() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.m {
		if k.zero != 0 {
			delete(c.m, k)
			c.size -= len(e.prog.Ops)
		}
	}
}

func (c *Cache) get(k cacheKey) *cacheEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[k]
	if e != nil {
		c.hits++
	} else {
		c.misses++
	}
	return e
}

func (c *Cache) put(k cacheKey, e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.Limit
	if limit <= 0 {
		limit = 512 << 10
	}
	if c.m == nil || c.size+len(e.prog.Ops) > limit {
		c.m, c.size = map[cacheKey]*cacheEntry{}, 0
	}
	c.m[k] = e
	c.size += len(e.prog.Ops)
}

// lowering is the key of k's lowered program.
func (k cacheKey) lowering() cacheKey {
	k.ckpt, k.lowered = "", true
	return k
}

// transform is transform for a cacheable spec and its lowered program p
// (cached under k.lowering()): it caches the program before sharding and
// offload.
func (c *Cache) transform(k cacheKey, s *Spec, p *ir.Program, stage int, sl slice) (*ir.Program, int64, error) {
	q, err := s.preChain(p, nil, stage, sl)
	if err != nil {
		return nil, 0, err
	}
	e := &cacheEntry{prog: q, params: paramCount(q)}
	c.put(k, e)
	q, err = c.post(k, e, s)
	return q, e.params, err
}

// post applies s's sharding and offload to the cached program of e (key
// k). The sharded program is cached too (keyed by k and the sharding), so
// the offload variants of one sharding shard once.
func (c *Cache) post(k cacheKey, e *cacheEntry, s *Spec) (*ir.Program, error) {
	shard := s.shardTransforms()
	if len(shard) == 0 {
		return strategy.Chain(e.prog, s.offloadTransforms()...)
	}
	k.zero, k.dp, k.bucket = s.ZeRO, s.DP, s.ZeROBucketElems
	if k.zero == 0 {
		k.zero = -1 // DDP, distinct from the unsharded key
	}
	sharded := c.get(k)
	if sharded == nil {
		q, err := strategy.Chain(e.prog, shard...)
		if err != nil {
			return nil, err
		}
		sharded = &cacheEntry{prog: q, params: e.params}
		c.put(k, sharded)
	}
	return strategy.Chain(sharded.prog, s.offloadTransforms()...)
}
