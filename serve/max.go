package serve

import (
	"fmt"
)

// ContextResult is the answer of MaxContext.
type ContextResult struct {
	// Requests is the concurrency asked for; Context the largest tokens per
	// request at which the KV cache holds that many (0: none).
	Requests int64
	Context  int
	// At is the deployment at Context, Beyond the one at Context+1 (nil
	// when Context is Cap); Cap bounds the search and CapWhy says why.
	At, Beyond *Result
	Cap        int
	CapWhy     string
	// FollowsModelLen: max_model_len was not given, so each value is
	// planned as the deployment started with --max-model-len at it.
	FollowsModelLen bool
	// Plans counts the deployments planned.
	Plans int
	// Gap is the shorter contexts that do not hold the requests, [first,
	// last] ([0, 0]: none, every context up to Context holds them): when the
	// answer is above vLLM's chunked-prefill switch, those from the longest
	// context below it that holds them up to the switch.
	Gap [2]int
}

// holds says whether r starts and its cache holds n requests of r's
// context.
func holds(r *Result, n int64) bool { return r.Fits && r.ConcurrencyAtContext >= n }

// MaxContext is the largest context (tokens per request) at which the KV
// cache of s holds requests concurrent requests: what `memplan max --context
// '?' --requests N` answers. With s.MaxModelLen given, the context is at most
// it and the deployment stays as given; without it, each context C is
// planned as the deployment vLLM would start with max_model_len C (the
// profile run, and so the cache, depend on it).
//
// Monotonicity: at a fixed profile run the blocks are fixed and a request
// of C tokens holds ceil(C/block) of them, non-decreasing in C, so the
// requests held never grow with C. When max_model_len follows C, the
// profile run's tokens, max(C, 2048) without chunked prefill, never fall
// as C grows, nor does its activation peak, so the blocks never grow and
// "holds" is again true on a prefix. vLLM turns chunked prefill on by
// default above 32K tokens of max_model_len, which shrinks the profile run
// to 512 tokens and raises the blocks: the search therefore runs on each
// side of that switch (each side monotone) and takes the larger answer;
// shorter contexts below the switch that do not hold the requests are Gap.
// TestPropertyMaxContextMatchesScan checks it against a scan of every value.
func MaxContext(s Spec, requests int64) (*ContextResult, error) {
	if requests < 1 {
		return nil, bad(FieldRequests, "{requests} must be at least 1, got %d", requests)
	}
	if s.Context != 0 {
		return nil, bad(FieldContext, "{context} is what is solved for; give it no value")
	}
	m := &ctxSolver{base: s, n: requests, res: &ContextResult{Requests: requests, FollowsModelLen: s.MaxModelLen == 0}}
	r := m.res
	probe := s
	if r.FollowsModelLen {
		// The other fields are checked at the smallest deployment.
		probe.MaxModelLen, probe.Prompt = 1, min(max(s.Prompt, 0), 1)
	}
	if err := probe.Validate(); err != nil {
		return nil, err
	}
	r.Cap, r.CapWhy = probe.MaxModelLen, fmt.Sprintf("{max-model-len} %d", probe.MaxModelLen)
	if r.FollowsModelLen {
		r.Cap, r.CapWhy = s.Model.MaxPositions, fmt.Sprintf("%s's %d positions", s.Model.Name, s.Model.MaxPositions)
		if r.Cap <= 0 {
			r.Cap, r.CapWhy = 1<<26, "the largest {max-model-len}"
		}
	}
	segs := [][2]int{{1, r.Cap}}
	if r.FollowsModelLen && s.ChunkedPrefill == nil && r.Cap > chunkedPrefillAbove {
		segs = [][2]int{{1, chunkedPrefillAbove}, {chunkedPrefillAbove + 1, r.Cap}}
	}
	if r.FollowsModelLen && s.MaxNumBatchedTokens > 0 {
		// Without chunked prefill a prompt must fit one batch: the
		// given batch bounds max_model_len there.
		for i := range segs {
			chunked := s.ChunkedPrefill != nil && *s.ChunkedPrefill || s.ChunkedPrefill == nil && segs[i][0] > chunkedPrefillAbove
			if !chunked {
				segs[i][1] = min(segs[i][1], s.MaxNumBatchedTokens)
			}
		}
	}
	best := 0
	for i, sg := range segs {
		v, err := m.largest(sg[0], sg[1])
		if err != nil {
			return nil, err
		}
		if i > 0 && v > best && best < chunkedPrefillAbove {
			r.Gap = [2]int{best + 1, chunkedPrefillAbove}
		}
		best = max(best, v)
	}
	r.Context = best
	var err error
	if best > 0 {
		if r.At, err = m.plan(best); err != nil {
			return nil, err
		}
	}
	if best < r.Cap {
		if r.Beyond, err = m.plan(best + 1); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// ctxSolver holds what MaxContext's probes share.
type ctxSolver struct {
	base Spec
	n    int64
	res  *ContextResult
}

// plan is the deployment at context c.
func (m *ctxSolver) plan(c int) (*Result, error) {
	s := m.base
	s.Context = c
	if m.res.FollowsModelLen {
		s.MaxModelLen = c
		if s.Prompt > c {
			s.Prompt = c
		}
	}
	m.res.Plans++
	return Plan(s)
}

// largest is the largest c in [lo, hi] that holds the requests (0: none),
// by bisection: holds is true on a prefix of the segment.
func (m *ctxSolver) largest(lo, hi int) (int, error) {
	if lo > hi {
		return 0, nil
	}
	ok, err := m.holdsAt(lo)
	if err != nil || !ok {
		return 0, err
	}
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		ok, err := m.holdsAt(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo, nil
}

func (m *ctxSolver) holdsAt(c int) (bool, error) {
	r, err := m.plan(c)
	if err != nil {
		return false, err
	}
	return holds(r, m.n), nil
}
