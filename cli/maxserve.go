package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/memplan/memplan/serve"
)

// maxServe is max in serve mode: --requests '?' at --context N (how many
// concurrent requests the KV cache holds) or --context '?' at --requests N
// (the longest context that many requests get), both through serve.
type maxServe struct {
	requests      int
	askRequests   bool
	askContext    bool
	modeGiven     bool
	mode, context string
}

// maxServeJSON is memplan.max/v1 for a serving dimension.
type maxServeJSON struct {
	Schema    string `json:"schema"`
	Dimension string `json:"dimension"`
	// Value is the answer (0: nothing fits); Requests and Context the
	// deployment's at the answer.
	Value     int64  `json:"value"`
	Requests  int64  `json:"requests"`
	Context   int    `json:"context"`
	Cap       int    `json:"cap,omitempty"`
	CapReason string `json:"cap_reason,omitempty"`
	AtCap     bool   `json:"at_cap"`
	Plans     int    `json:"plans"`
	// Gap: --context, the shorter contexts [first, last] that do not hold
	// the requests (above vLLM's chunked-prefill switch the cache is larger).
	Gap       *[2]int      `json:"gap,omitempty"`
	Scheduler string       `json:"scheduler_note,omitempty"`
	At        *serveReport `json:"at,omitempty"`
	Beyond    *serveReport `json:"beyond,omitempty"`
	// BeyondBlocksNeeded: --requests, the blocks one more request needs in
	// all (beyond the cache's gpu_blocks).
	BeyondBlocksNeeded int64    `json:"beyond_blocks_needed,omitempty"`
	Warnings           []string `json:"warnings,omitempty"`
}

// check refuses what max in serve mode cannot take.
func (m *maxServe) check() error {
	if m.modeGiven && m.mode != "serve" {
		what := "--requests"
		if m.askContext && !m.askRequests {
			what = "--context '?'"
		}
		return fmt.Errorf("%s applies to --mode serve, not --mode %s", what, m.mode)
	}
	switch {
	case m.askRequests && m.askContext:
		return fmt.Errorf("max solves for one dimension at a time; --requests and --context were both given '?'")
	case m.askContext && m.requests < 1:
		return fmt.Errorf("--context '?' needs --requests N: the concurrent requests the context must serve")
	case m.askRequests && m.requests != 0:
		return fmt.Errorf("--requests is what is solved for; it cannot also be %d", m.requests)
	}
	return nil
}

func (m *maxServe) run(stdout io.Writer, jsonOut bool, sf *serveFlags, p *planFlags) error {
	if err := m.check(); err != nil {
		return err
	}
	sf.contextAsked = m.askContext
	s, err := sf.spec(p)
	if err != nil {
		return err
	}
	var j maxServeJSON
	if m.askRequests {
		n, r, err := serve.MaxRequests(s, 0)
		if err != nil {
			return serveErr(err)
		}
		at := serveJSON(r)
		j = maxServeJSON{Dimension: "requests", Value: n, Requests: n, Context: r.Spec.Context, Plans: 1, At: &at}
		per := int64((r.Spec.Context + r.Spec.BlockSize - 1) / r.Spec.BlockSize)
		j.BeyondBlocksNeeded = (n + 1) * per
		if !r.Fits {
			j.Value, j.Requests = 0, 0
		}
		if n > int64(r.Spec.MaxNumSeqs) {
			j.Scheduler = fmt.Sprintf("vLLM runs at most --max-num-seqs %d of them at once; raise it to run all %d", r.Spec.MaxNumSeqs, n)
		}
	} else {
		s.Context = 0
		r, err := serve.MaxContext(s, int64(m.requests))
		if err != nil {
			return serveErr(err)
		}
		j = maxServeJSON{Dimension: "context", Value: int64(r.Context), Requests: int64(m.requests), Context: r.Context, Cap: r.Cap,
			CapReason: fieldRef.ReplaceAllString(r.CapWhy, "--$1"), AtCap: r.Context > 0 && r.Context == r.Cap, Plans: r.Plans}
		if r.Gap[0] > 0 {
			g := r.Gap
			j.Gap = &g
		}
		if r.At != nil {
			at := serveJSON(r.At)
			j.At = &at
			if m.requests > r.At.Spec.MaxNumSeqs {
				j.Scheduler = fmt.Sprintf("vLLM runs at most --max-num-seqs %d requests at once; raise it to run all %d", r.At.Spec.MaxNumSeqs, m.requests)
			}
		}
		if r.Beyond != nil {
			b := serveJSON(r.Beyond)
			j.Beyond = &b
		}
	}
	j.Schema = "memplan.max/v1"
	err = emit(stdout, jsonOut, func(w io.Writer) error { return writeJSON(w, j) }, func(w io.Writer) error { return writeMaxServeText(w, &j) })
	if err == nil && j.Value == 0 {
		return verdict(ExitNothingFits)
	}
	return err
}

func writeMaxServeText(w io.Writer, j *maxServeJSON) error {
	var b strings.Builder
	ref := j.At
	if ref == nil {
		ref = j.Beyond
	}
	gpu := ref.GPU
	if gpu == "" {
		gpu = "total " + fmt.Sprint(ref.TotalMemory) + " bytes"
	}
	fmt.Fprintf(&b, "memplan max · --%s ? · %s · serve (vLLM) · %s × tp %d · %s weights (%s) · KV cache %s, block %d\n\n",
		j.Dimension, ref.Model, gpu, ref.TP, ref.DType, ref.Quantization, ref.KVCacheDType, ref.BlockSize)
	line := func(r *serveReport) {
		per := (int64(r.Context) + int64(r.BlockSize) - 1) / int64(r.BlockSize)
		fmt.Fprintf(&b, "  context %d (--max-model-len %d): %d KV blocks of %d tokens, %d per request: %d requests\n",
			r.Context, r.MaxModelLen, r.Blocks, r.BlockSize, per, r.Requests)
	}
	switch {
	case j.Dimension == "requests" && j.Value == 0:
		fmt.Fprintf(&b, "Nothing fits: the KV cache holds %d tokens, fewer than --max-model-len %d (vLLM refuses to start)\n", ref.Tokens, ref.MaxModelLen)
		line(ref)
	case j.Dimension == "requests":
		fmt.Fprintf(&b, "Largest number of concurrent requests of %d tokens: %d\n", j.Context, j.Value)
		line(j.At)
		fmt.Fprintf(&b, "  %d requests: need %d blocks, %d more than the cache's %d\n", j.Value+1, j.BeyondBlocksNeeded, j.BeyondBlocksNeeded-j.At.Blocks, j.At.Blocks)
	case j.Value == 0:
		fmt.Fprintf(&b, "Nothing fits: even a 1-token context does not give %d concurrent requests\n", j.Requests)
		line(ref)
	default:
		fmt.Fprintf(&b, "Longest context for %d concurrent requests: %d tokens", j.Requests, j.Value)
		if j.AtCap {
			fmt.Fprintf(&b, ", the bound of the search (%s); memory does not stop it", j.CapReason)
		}
		b.WriteString("\n")
		line(j.At)
		if j.Beyond != nil {
			line(j.Beyond)
		}
	}
	if j.Scheduler != "" {
		fmt.Fprintf(&b, "Note: %s\n", j.Scheduler)
	}
	switch {
	case j.Gap != nil:
		fmt.Fprintf(&b, "(%d deployments planned; contexts %d to %d do not hold them: vLLM turns chunked prefill on above %d tokens of --max-model-len, which leaves more memory to the KV cache; every other shorter context does)\n", j.Plans, j.Gap[0], j.Gap[1], j.Gap[1])
	case j.Dimension == "context":
		fmt.Fprintf(&b, "(%d deployments planned; the requests a KV cache holds never grow with the context, so every shorter context holds them too)\n", j.Plans)
	case j.Plans == 1:
		b.WriteString("(1 deployment planned)\n")
	default:
		fmt.Fprintf(&b, "(%d deployments planned)\n", j.Plans)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
