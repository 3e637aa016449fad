package engine

import (
	"sync"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
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
// about Limit ops' worth of programs, each program counted once however
// many keys share it (a lowered program without checkpointing or a
// pipeline is also its scheduled one); when full, it drops the programs
// used least recently until the new one fits.
//
// Limit 0 is at least 512Ki ops and at least four times the largest
// program put: a job's steady and first-step programs and one variant's
// pair. A fixed 512Ki held less than one iteration of the largest mixtures
// of experts (deepseek-v2: 299,427 ops per program, counted twice), so
// plan's next step and each of compare's strategies built and lowered the
// model again.
type Cache struct {
	Limit int

	mu           sync.Mutex
	m            map[cacheKey]*cacheEntry
	refs         map[*ir.Program]int // the keys holding each program
	size         int                 // ops of the distinct programs held
	largest      int                 // ops of the largest program put
	hits, misses int
	// tick counts lookups and insertions; each entry keeps the tick of its
	// last use, and the least recently used go first.
	tick uint64
	// filter: put keeps only the programs that one of the specs in only
	// plans from (putOnlyFor).
	filter bool
	only   []want
	// graph is the last forward graph built through the cache and what it
	// was built from (graphFor): a strategy that changes only the lowering
	// (compare's and the next step's fused optimizer step) lowers it
	// again instead of building the model again (deepseek-v2: 0.45 s).
	graph struct {
		model *models.Arch
		o     build.Options
		g     *ir.Graph
	}
	// derive: a program whose sharding and offload are autocast's cache
	// alone is held as the program that cache made, the plan's own
	// (cacheEntry.exits), not beside it (LeverCache).
	derive bool
	// lever: the baseline a LeverCache was made for, until settled.
	lever *leverBase
	// lent counts the results that hold each cached program
	// (Result.borrow), which no plan may take while any does.
	lent map[*ir.Program]int
	// taken counts the programs plans took (tests read it).
	taken int
}

// graphFor is the graph of model built with o, built by build unless it
// is the cache's last one. A graph is read only once built (lowering reads
// it; the steady and first steps are lowered from one). A nil cache builds.
func (c *Cache) graphFor(model *models.Arch, o build.Options, build func() (*ir.Graph, error)) (*ir.Graph, error) {
	if c == nil {
		return build()
	}
	c.mu.Lock()
	if c.graph.g != nil && c.graph.model == model && c.graph.o == o {
		g := c.graph.g
		c.mu.Unlock()
		return g, nil
	}
	c.mu.Unlock()
	g, err := build()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.graph.model, c.graph.o, c.graph.g = model, o, g
	c.mu.Unlock()
	return g, nil
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
	used   uint64 // Cache.tick at its last use
	// exits: prog is the program autocast's cache made from the entry's
	// (Cache.derive), and the entry's program is prog without its
	// ir.AutocastExit ops (program).
	exits bool
	// last: the plan now being planned through the cache is the last
	// that plans from it (Cache.markLast): it may take the program
	// (Cache.take) and rewrite it in place.
	last bool
}

// cacheKey keys a cached program: the spec with the parts the program
// before sharding does not depend on zeroed (Spec.preShardKey), the stage,
// and for a sharded program its sharding.
type cacheKey struct {
	spec  Spec
	stage int
	// first: the first iteration's program (Spec.FirstStep asks for both).
	first bool
	// whole: built from the whole model (Options.wholeStages).
	whole bool
	// flat: the graph is built for FSDP1 FlatParameters (Spec.flatParams),
	// which depends on the ZeRO stage.
	flat bool
	// lowered marks the lowered program, before checkpointing (the spec's
	// Checkpoint is zero).
	lowered bool
	// shard is set for a sharded program (ZeRO -1: DDP).
	shard Sharding
}

// preShardKey is s with what the program before sharding and offload does
// not depend on zeroed: the sharding and offload (applied after the cached
// program), the target (what the program is judged against, not what it
// is) and the first step (a key says which program it holds).
// TestKeysCoverEverySpecField checks every field of Spec is either here or
// listed there as ignored with its reason.
func (s *Spec) preShardKey() Spec {
	k := *s
	k.Sharding = Sharding{}
	k.Offload = Offload{}
	k.Target = Target{}
	return k
}

// cacheKey is s's key for stage stage, and whether its program may be
// cached (catalog training without auto checkpointing, whose choice
// depends on more than the key).
func (pl *planner) cacheKey(first bool, stage int) (cacheKey, bool) {
	k, ok := pl.key(first, stage)
	return k, ok && pl.s.Checkpoint.Kind != CheckpointAuto
}

// key is s's key for stage stage, and whether the cache applies at all
// (through a cache, catalog training).
func (pl *planner) key(first bool, stage int) (cacheKey, bool) {
	s := pl.s
	if pl.o.Cache == nil || s.Trace != nil || s.Model == nil || s.Mode != Train {
		return cacheKey{}, false
	}
	return cacheKey{spec: s.preShardKey(), stage: stage, first: first, whole: pl.o.wholeStages, flat: s.flatParams()}, true
}

// autoLoweringKey is the key of the lowered program auto checkpointing
// chooses its blocks on, when a cached one serves it: the lowering is the
// one without checkpointing (the checkpoint is a transform after it, and
// cacheKey.lowering keys it without), so a job planned before serves it
// (compare's auto row lowered deepseek-v3 again, 0.7 s). Not under a
// pipeline: auto checkpointing plans a stage from the whole model
// (stageSlice), where the cached lowering of the stage may be its slice.
// transform never writes its input (strategy.Chain), and a result planned
// through it is not owned (Result.Release leaves its program alone).
func (pl *planner) autoLoweringKey(first bool, stage int) (cacheKey, bool) {
	k, ok := pl.key(first, stage)
	return k.lowering(), ok && pl.s.Checkpoint.Kind == CheckpointAuto && pl.s.PP <= 1
}

// DropSharded forgets the sharded programs (keeping those before
// sharding): a search that has moved on to another ZeRO stage or
// data-parallel degree will not ask for them again.
func (c *Cache) DropSharded() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.m {
		if k.shard != (Sharding{}) {
			c.drop(k, e)
		}
	}
}

// keepFor forgets every program none of specs plans from: for each, its
// lowered program, the one its checkpointing made and the one its sharding
// made (its offload is applied after them, and never cached). Compare and
// the next step plan each strategy once on base's job, one after another;
// after each they keep what the strategies still to come plan from (base's
// programs for those that change only sharding or offload, its lowered
// one for those that change checkpointing), and nothing once the last is
// planned. What a strategy made for itself (another checkpointing, a
// lowering for another optimizer step, another sharding) is not asked for
// again. Held until evicted, the checkpointed programs of compare on
// deepseek-v2 were a third of its live heap; base's lowered program, held
// past the last checkpointing row, was a quarter of compare deepseek-v3's
// live heap while it offloaded activations.
func (c *Cache) keepFor(specs []Spec, o Options) {
	ws := wants(specs, o)
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.m {
		if !key.wantedBy(ws, c.m) {
			c.drop(key, e)
		}
	}
}

// putOnlyFor makes the cache hold from now on only the programs specs plan
// from (keepFor's rule), and every program again after putOnlyFor(nil,
// false). Each strategy compare and the next step plan is planned with the
// strategies after it as specs: a program only it plans from is used once
// and garbage as soon as it is, where cached it stayed live until the next
// keepFor (compare deepseek-v3: each checkpointing's program was held beside
// the program its offload and autocast made from it).
func (c *Cache) putOnlyFor(specs []Spec, o Options, on bool) {
	ws := wants(specs, o)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.only, c.filter = ws, on
}

// want is what a spec plans from, as cache keys name it.
type want struct {
	k, lk Spec // the keys' specs of its program before sharding and of its lowered one
	shard Sharding
}

// wants is what specs plan from, each planned as o says (its programs
// keyed by the micro-steps it is planned with, plannedAccum).
func wants(specs []Spec, o Options) []want {
	ws := make([]want, len(specs))
	for i := range specs {
		s := specs[i]
		s.Accum = plannedAccum(&s, o)
		w := want{k: s.preShardKey(), shard: s.Sharding}
		w.lk = w.k
		w.lk.Checkpoint = CheckpointPolicy{}
		if w.shard.ZeRO == 0 && len(s.shardTransforms()) > 0 {
			w.shard.ZeRO = -1 // DDP (Cache.post)
		}
		ws[i] = w
	}
	return ws
}

// wantedBy says whether one of ws plans from the program of key k, among
// the programs of m: a lowered program only for a spec whose program
// before sharding is not in m (the one it checkpoints from it).
func (k cacheKey) wantedBy(ws []want, m map[cacheKey]*cacheEntry) bool {
	for _, w := range ws {
		if k.shard != (Sharding{}) && k.shard != w.shard {
			continue
		}
		if !k.lowered && k.spec == w.k {
			return true
		}
		if k.lowered && k.spec == w.lk {
			pk := k
			pk.spec, pk.lowered = w.k, false
			if m[pk] == nil {
				return true
			}
		}
	}
	return false
}

// wantsLowering says whether the cache would keep the lowered program of
// key's spec for another plan: a filtered cache keeps it only for a spec
// that plans from it but not from key's program before sharding, which the
// plan lowering it is about to make (and the cache to keep for those that
// plan from it).
func (c *Cache) wantsLowering(key cacheKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.filter {
		return true
	}
	lk := key.lowering()
	for _, w := range c.only {
		if w.k != key.spec && lk.wantedBy([]want{w}, c.m) {
			return true
		}
	}
	return false
}

// holds reports whether p is a program the cache keeps (under any key).
func (c *Cache) holds(p *ir.Program) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refs[p] > 0
}

// has reports whether c holds a program under k (a lookup that counts
// neither as a hit nor as a use).
func (c *Cache) has(k cacheKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k] != nil
}

func (c *Cache) get(k cacheKey) *cacheEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[k]
	if e != nil {
		c.hits++
		c.tick++
		e.used = c.tick
	} else {
		c.misses++
	}
	return e
}

// put caches e under k and reports whether c holds it: not when the
// filter (putOnlyFor) refuses it, and then the caller owns the program.
func (c *Cache) put(k cacheKey, e *cacheEntry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.filter && !k.wantedBy(c.only, c.m) {
		return false
	}
	if c.m == nil {
		c.m = map[cacheKey]*cacheEntry{}
		c.refs = map[*ir.Program]int{}
	}
	if old := c.m[k]; old != nil {
		c.drop(k, old)
	}
	n := len(e.prog.Ops)
	c.largest = max(c.largest, n)
	if c.refs[e.prog] == 0 {
		c.evict(c.limit() - n)
	}
	c.tick++
	e.used = c.tick
	c.m[k] = e
	if c.refs[e.prog]++; c.refs[e.prog] == 1 {
		c.size += n
	}
	return true
}

// owned puts e under k and reports whether the caller owns its program:
// neither refused under k nor held under another key. A transform that
// leaves its input as it was makes no new program (the steps before
// sharding without checkpointing or a pipeline), so a program refused as
// the one before sharding may be the lowered one the cache holds.
func (c *Cache) owned(k cacheKey, e *cacheEntry) bool {
	return !c.put(k, e) && !c.holds(e.prog)
}

// limit is the most ops the cache holds (Cache.Limit).
func (c *Cache) limit() int {
	if c.Limit > 0 {
		return c.Limit
	}
	return max(512<<10, 4*c.largest)
}

// drop forgets key k (holding e); its program's ops leave the size with
// the last key that holds it.
func (c *Cache) drop(k cacheKey, e *cacheEntry) {
	delete(c.m, k)
	if c.refs[e.prog]--; c.refs[e.prog] <= 0 {
		delete(c.refs, e.prog)
		c.size -= len(e.prog.Ops)
	}
}

// evict drops the least recently used programs until at most room ops'
// worth are left (all of them when room is negative). Emptying the whole
// cache instead, as it once did, rebuilt about one program in eight of a
// mixtral-8x7b search's LoRA bundles (the lowered and checkpointed programs
// the next ZeRO stage asks for again); a scan per eviction costs nothing
// next to building one program (the cache holds a few hundred).
func (c *Cache) evict(room int) {
	for c.size > room && len(c.m) > 0 {
		var oldest cacheKey
		var at uint64
		first := true
		for k, e := range c.m {
			if first || e.used < at {
				oldest, at, first = k, e.used, false
			}
		}
		c.drop(oldest, c.m[oldest])
	}
}

// lowering is the key of k's lowered program.
func (k cacheKey) lowering() cacheKey {
	k.spec.Checkpoint, k.lowered = CheckpointPolicy{}, true
	return k
}

// transform is transform for a cacheable spec and its lowered program p
// (cached under k.lowering(), or the caller's own when own): it caches the
// program before sharding and offload. Each program the cache does not hold
// under any key (owned: its filter refused it, as plan's baseline, whose
// programs the lever does not plan from) is handed to the next transform to
// rewrite in place: the
// lowered program to the pipeline (deepseek-v3 --pp 4: a copy of a million
// tensors a stage), the one before sharding to autocast's cache (the ops
// moved in place, not copied into a new array).
func (c *Cache) transform(k cacheKey, s *Spec, p *ir.Program, own bool, stage int, sl slice) (*ir.Program, int64, error) {
	q, err := s.preChain(p, own, nil, stage, sl)
	if err != nil {
		return nil, 0, err
	}
	e := &cacheEntry{prog: q, params: paramCount(q)}
	if c.derive && (q != p || own) && len(s.shardTransforms()) == 0 {
		if ts := s.offloadTransforms(); autocastOnly(ts) {
			// The program before sharding is new and no one else's: a
			// cache that derives would hold what autocast's cache makes
			// of it in its place (finish), so that is made in place, not
			// in a copy that leaves it garbage. plan deepseek-v3 --accum
			// 4 --checkpoint full with a budget it fits copied its steady
			// and first-step programs of 1.5 million ops each: 8.8-9.6 s
			// and 2.73 GB of RSS, 6.3-6.8 s and 2.38-2.45 GB in place.
			if e.prog, err = strategy.ChainOwned(q, ts...); err != nil {
				return nil, 0, err
			}
			e.exits = true
			c.put(k, e)
			return e.prog, e.params, nil
		}
	}
	q, err = c.post(k, e, s, c.owned(k, e))
	return q, e.params, err
}

// autocastOnly says whether ts is autocast's cache alone.
func autocastOnly(ts []strategy.Transform) bool {
	if len(ts) != 1 {
		return false
	}
	_, ok := ts[0].(*strategy.AutocastCache)
	return ok
}

// post applies s's sharding and offload to the cached program of e (key
// k; the caller's own when own). The sharded program is cached too (keyed
// by k and the sharding), so the offload variants of one sharding shard
// once.
func (c *Cache) post(k cacheKey, e *cacheEntry, s *Spec, own bool) (*ir.Program, error) {
	shard := s.shardTransforms()
	if len(shard) == 0 {
		return c.finish(e, s.offloadTransforms(), own)
	}
	k.shard = s.Sharding
	if k.shard.ZeRO == 0 {
		k.shard.ZeRO = -1 // DDP, distinct from the unsharded key
	}
	sharded := c.get(k)
	ownSharded := false
	if sharded == nil {
		p, made := c.program(e, own)
		chain := strategy.Chain
		if made || own {
			chain = strategy.ChainOwned
		}
		q, err := chain(p, shard...)
		if err != nil {
			return nil, err
		}
		sharded = &cacheEntry{prog: q, params: e.params}
		ownSharded = c.owned(k, sharded)
	}
	return c.finish(sharded, s.offloadTransforms(), ownSharded)
}

// finish applies the offload transforms ts to the program of e (the
// caller's own when own, which they then rewrite in place). Where ts
// is autocast's cache alone, a cache that derives (LeverCache) keeps the
// program it makes in place of e's, which is that program without its
// exits: plan's result holds it anyway, and deepseek-v3's steady and
// first-step programs (1.4 million ops each) were held twice, 0.43 GB.
func (c *Cache) finish(e *cacheEntry, ts []strategy.Transform, own bool) (*ir.Program, error) {
	autocastOnly := autocastOnly(ts)
	c.mu.Lock()
	held, exits := e.prog, e.exits
	c.mu.Unlock()
	if exits {
		if autocastOnly {
			return held, nil // the program autocast's cache made from this one
		}
		if own {
			return strategy.ChainOwned(strategy.DropExits(held), ts...)
		}
		return strategy.ChainOwned(strategy.WithoutExits(held), ts...)
	}
	chain := strategy.Chain
	if own {
		chain = strategy.ChainOwned
	}
	q, err := chain(held, ts...)
	if err != nil || own || !c.derive || !autocastOnly || q == held {
		return q, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.refs[held]; n > 0 && c.refs[q] == 0 {
		for _, x := range c.m {
			if x.prog == held {
				x.prog, x.exits = q, true
			}
		}
		delete(c.refs, held)
		c.refs[q] = n
		c.size += len(q.Ops) - len(held.Ops)
	}
	return q, nil
}

// program is the program e holds: for an entry that holds what autocast's
// cache made from it (exits), that program made again
// (strategy.WithoutExits), a copy of the caller's own (own). mine: the
// program is already the caller's (taken, Cache.take, or made for it),
// and is made again in place.
func (c *Cache) program(e *cacheEntry, mine bool) (p *ir.Program, own bool) {
	c.mu.Lock()
	q, exits := e.prog, e.exits
	c.mu.Unlock()
	switch {
	case exits && mine:
		return strategy.DropExits(q), true
	case exits:
		return strategy.WithoutExits(q), true
	}
	return q, mine
}

// markLast marks the programs none of specs (planned as o says) plans
// from: the plan planned next, before them, is the last that may read
// each, and may take it (take). eachSpec marks before each plan.
func (c *Cache) markLast(specs []Spec, o Options) {
	ws := wants(specs, o)
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, e := range c.m {
		e.last = !k.wantedBy(ws, c.m)
	}
}

// take reports whether the plan asking for e under k takes its program,
// which the cache then forgets: e is on its last use (markLast), no other
// key holds the program and no result holds it (Result.borrow). A taken
// program is rewritten in place where a copy was made (deepseek-v3 --accum
// 4 --checkpoint full: the next step copied the steady and first-step
// programs of 2.1 million ops to offload the optimizer, 0.62 GB beside
// them).
func (c *Cache) take(k cacheKey, e *cacheEntry) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !e.last || c.m[k] != e || c.refs[e.prog] != 1 || c.lent[e.prog] > 0 {
		return false
	}
	c.drop(k, e)
	c.taken++
	return true
}

// lend records that a result holds cached program p (nil: none), and
// reports whether the cache holds it; giveBack that it no longer does.
func (c *Cache) lend(p *ir.Program) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p == nil || c.refs[p] == 0 {
		return false
	}
	if c.lent == nil {
		c.lent = map[*ir.Program]int{}
	}
	c.lent[p]++
	return true
}

func (c *Cache) giveBack(p *ir.Program) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lent[p]--; c.lent[p] <= 0 {
		delete(c.lent, p)
	}
}
