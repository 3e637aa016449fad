package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/memplan/memplan/k8s"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/units"
)

type extenderFlags struct {
	addr, policy, margin, refs, pods string
	timeout                          time.Duration
}

func newExtenderCmd(stderr io.Writer) *cobra.Command {
	f := &extenderFlags{}
	c := &cobra.Command{
		Use:   "extender",
		Short: "Serve a kube-scheduler extender that places GPU pods by their memory envelopes",
		Long: "extender serves the kube-scheduler extender protocol (POST /filter, POST /prioritize; configure it\n" +
			"with nodeCacheCapable: false). A pod declares its job in the annotation memplan.io/workload (a job of\n" +
			"memplan pack's job file without its name); a node's GPUs come from GPU feature discovery's labels\n" +
			"(nvidia.com/gpu.product, nvidia.com/gpu.count) and what runs there from the pods bound to it, listed\n" +
			"from the API server in the cluster or read from --pods. Filter refuses a node whose GPUs cannot hold\n" +
			"the pod beside them under --policy; prioritize prefers the tightest fit. The extender reads files for a\n" +
			"pod only from --refs (plan:, snapshot:); model: and recipe: take catalog models and embedded recipes,\n" +
			"never a path, since whoever creates pods writes the annotation and the disk is the scheduler's (a model\n" +
			"of your own: a plan JSON under --refs). See deploy/README.md.",
		Example: `  memplan extender --addr :8888
  memplan extender --addr 127.0.0.1:8888 --pods pods.json --policy peaks --margin 1GiB`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd.Context(), stderr) },
	}
	fl := c.Flags()
	fl.StringVar(&f.addr, "addr", ":8888", "HOST:PORT to listen on")
	fl.StringVar(&f.policy, "policy", "curve", "how a GPU's processes are counted: curve or peaks (see memplan pack)")
	fl.StringVar(&f.margin, "margin", "0", "memory kept free on every GPU, e.g. 1GiB")
	fl.StringVar(&f.refs, "refs", "", "directory that plan: and snapshot: in annotations are read from (model: and recipe: are catalog names, never paths)")
	fl.StringVar(&f.pods, "pods", "", "a PodList JSON (kubectl get pods -A -o json) instead of the API server's pods")
	fl.DurationVar(&f.timeout, "timeout", 25*time.Second, "bound on one request, planning a new workload included (below the scheduler's httpTimeout): past it, the pod's Error and the planning stops")
	return c
}

func (f *extenderFlags) extender() (*k8s.Extender, error) {
	p, err := pack.ParsePolicy(f.policy)
	if err != nil || (p != pack.Curve && p != pack.Peaks) {
		return nil, fmt.Errorf("--policy %q: want curve or peaks", f.policy)
	}
	m, err := units.ParseBytesOrZero(f.margin)
	if err != nil {
		return nil, fmt.Errorf("--margin %q: want a size such as 1GiB, or 0", f.margin)
	}
	if f.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %s: want a positive duration", f.timeout)
	}
	if f.refs != "" {
		if st, err := os.Stat(f.refs); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("--refs %s: not a directory", f.refs)
		}
	}
	x := &k8s.Extender{Planner: &k8s.Planner{Policy: p, Margin: m, Refs: f.refs}, Timeout: f.timeout}
	if f.pods != "" {
		pf, err := k8s.ReadPodFile(f.pods)
		if err != nil {
			return nil, fmt.Errorf("--pods %w", err)
		}
		x.Pods = pf
	} else {
		a, err := k8s.InCluster()
		if errors.Is(err, k8s.ErrNotInCluster) {
			return nil, fmt.Errorf("%w: give --pods FILE", err)
		}
		if err != nil {
			return nil, err
		}
		x.Pods = a
	}
	return x, nil
}

func (f *extenderFlags) run(ctx context.Context, stderr io.Writer) error {
	x, err := f.extender()
	if err != nil {
		return err
	}
	ln, err := listen(f.addr)
	if err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: x.Handler(), ReadHeaderTimeout: 10 * time.Second, WriteTimeout: f.timeout + 5*time.Second}
	fmt.Fprintf(stderr, "memplan extender listening on %s (policy %s)\n", ln.Addr(), f.policy)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
