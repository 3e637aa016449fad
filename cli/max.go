package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/search"
)

// askable is a flag of max that also takes "?": the dimension to solve for.
type askable struct {
	pflag.Value
	asked *bool
}

func (a askable) Set(v string) error {
	*a.asked = v == "?"
	if *a.asked {
		return nil
	}
	return a.Value.Set(v)
}

// maxFlags are max's flags: plan's, serve's, the serving question's, and which dimension is given '?'.
type maxFlags struct {
	plan    *planFlags
	serve   *serveFlags
	ms      *maxServe
	jsonOut bool
	asked   map[search.Dim]*bool
}

func newMaxCmd(stdout io.Writer) *cobra.Command {
	mf := &maxFlags{plan: &planFlags{}, serve: &serveFlags{}, ms: &maxServe{}, asked: map[search.Dim]*bool{}}
	c := &cobra.Command{
		Use:   "max",
		Short: "The largest micro-batch, sequence, generated-token count, or (serving) requests or context that fits: give '?' to the one to solve",
		Long: "max takes plan's flags and the value '?' for one of --micro-batch, --seq or --gen-tokens, and finds the\n" +
			"largest value at which the job fits the --gpu or --budget, everything else as given. Each value tried\n" +
			"is an exact plan; the search relies on the peak never falling as the value grows (every tensor's size\n" +
			"grows with it, the program's ops and lifetimes do not change). It prints the plan at the answer and\n" +
			"one step beyond: where that one overflows and what grew. In --mode serve (vLLM), --requests '?' is the\n" +
			"concurrent requests of --context tokens the paged KV cache holds, and --context '?' the longest context\n" +
			"--requests N requests get (with --max-model-len following it unless given).\n\n" + exitHelp,
		Example: `  memplan max --model llama-3-8b --gpu h100 --seq 4096 --micro-batch '?'
  memplan max --model llama-3-8b --gpu h100 --micro-batch 1 --seq '?' --checkpoint full
  memplan max --model llama-2-7b --gpu a100 --mode infer --seq 2048 --micro-batch 8 --gen-tokens '?' --json
  memplan max --mode serve --model llama-3.1-8b --gpu h100 --context 32768 --requests '?'
  memplan max --mode serve --model llama-3.1-8b --gpu h100 --requests 16 --context '?'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return mf.run(cmd, stdout) },
	}
	mf.register(c.Flags())
	return c
}

// register adds plan's and serve's flags, lets each dimension max can solve for (and serve's --requests and
// --context) take '?', and adds max's own.
func (mf *maxFlags) register(fl *pflag.FlagSet) {
	ms := mf.ms
	mf.plan.register(fl)
	for _, d := range search.Dims() {
		b := new(bool)
		mf.asked[d] = b
		fg := fl.Lookup(d.Field().Key())
		fg.Value = askable{fg.Value, b}
		fg.Usage += "; '?' solves for it"
	}
	mf.serve.register(fl)
	intVar(fl, &ms.requests, "requests", 0, "serve: concurrent requests; '?' solves for the most the KV cache holds at --context")
	for _, a := range []struct {
		name string
		b    *bool
	}{{"requests", &ms.askRequests}, {"context", &ms.askContext}} {
		fg := fl.Lookup(a.name)
		fg.Value = askable{fg.Value, a.b}
	}
	fl.Lookup("context").Usage += "; '?' solves for the longest context --requests N get"
	outputFlags(fl, &mf.jsonOut, "print the machine-readable JSON (memplan.max/v1)")
}

// run answers a serving question in --mode serve, else solves for the one training or inference dimension given
// '?'.
func (mf *maxFlags) run(cmd *cobra.Command, stdout io.Writer) error {
	f, ms := mf.plan, mf.ms
	ms.modeGiven, ms.mode = f.changed("mode"), f.mode
	if err := givenBelow(f.flags, 1, "requests"); err != nil {
		return err
	}
	if ms.askRequests || ms.askContext || f.mode == "serve" {
		if !ms.askRequests && !ms.askContext {
			return fmt.Errorf("max in --mode serve solves for --requests or --context: give it the value '?'")
		}
		return ms.run(stdout, mf.jsonOut, mf.serve, f)
	}
	if f.changed("requests") {
		return fmt.Errorf("--requests applies to --mode serve, not --mode %s", f.mode)
	}
	if err := mf.serve.unreadOutsideServe(f.mode); err != nil {
		return err
	}
	d, err := solvedDim(mf.asked)
	if err != nil {
		return err
	}
	return mf.solve(cmd, stdout, d)
}

// solve finds the largest value of dimension d that fits and prints the plan there and one step beyond; when
// nothing fits it names the largest lever and exits with ExitNothingFits.
func (mf *maxFlags) solve(cmd *cobra.Command, stdout io.Writer, d search.Dim) error {
	f := mf.plan
	spec, err := f.spec()
	if err != nil {
		return err
	}
	// The asked dimension's value is not the user's: no warning
	// about it.
	var ws []string
	for _, w := range f.warnings(&spec) {
		if !strings.HasPrefix(w, "--"+d.Field().Key()+" ") {
			ws = append(ws, w)
		}
	}
	done, err := heavyTurn(cmd.Context(), &spec) // beside another request of memplan serve
	if err != nil {
		return err
	}
	defer done()
	r, err := search.MaxContext(cmd.Context(), spec, d)
	nothing := errors.Is(err, search.ErrNothingFits)
	if err != nil && !nothing {
		return err // one line: the warnings are the answer's (sweep H, round 25)
	}
	warn(cmd.ErrOrStderr(), ws)
	var next *engine.Row
	if nothing {
		if next, err = nextStep(cmd.Context(), r.Beyond, r.Cache); err != nil {
			return err
		}
	}
	err = emit(stdout, mf.jsonOut,
		func(w io.Writer) error { return report.WriteMaxJSON(w, r, next, ws) },
		func(w io.Writer) error { return report.WriteMaxText(w, r, next) })
	if err == nil && nothing {
		return verdict(ExitNothingFits)
	}
	return err
}

// solvedDim is the one dimension given '?'.
func solvedDim(asked map[search.Dim]*bool) (search.Dim, error) {
	var got []search.Dim
	var names []string
	for _, d := range search.Dims() {
		names = append(names, "--"+d.Field().Key())
		if *asked[d] {
			got = append(got, d)
		}
	}
	switch len(got) {
	case 1:
		return got[0], nil
	case 0:
		return 0, fmt.Errorf("max solves for one of %s: give it the value '?'", strings.Join(names, ", "))
	}
	var gn []string
	for _, d := range got {
		gn = append(gn, "--"+d.Field().Key())
	}
	return 0, fmt.Errorf("max solves for one dimension at a time; %s were all given '?'", strings.Join(gn, " and "))
}
