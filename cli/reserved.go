package cli

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
)

// reservedFlags ask plan for the caching allocator's prediction: the
// reserved peak next to the allocated one, and which of the two decides fits.
type reservedFlags struct {
	off         bool
	conf, fitOn string
}

func (f *reservedFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.conf, "alloc-conf", "", "PyTorch caching-allocator settings for the reserved prediction, in PYTORCH_CUDA_ALLOC_CONF's words: expandable_segments:True, max_split_size_mb:N, roundup_power2_divisions:N or [MiB:N,...,>:N], garbage_collection_threshold:F")
	fl.StringVar(&f.fitOn, "fit-on", "allocated", "decide fits on the allocated peak (what torch.cuda.max_memory_allocated measures) or on the reserved peak the caching-allocator model predicts (what runs out first on the device)")
	fl.BoolVar(&f.off, "no-reserved", false, "skip the caching-allocator replay (no reserved prediction)")
}

// apply replays the planned iteration through the allocator model.
func (f *reservedFlags) apply(ctx context.Context, res *engine.Result, timeline bool) error {
	var decide bool
	switch f.fitOn {
	case "allocated":
	case "reserved":
		decide = true
	default:
		return fmt.Errorf("--fit-on %q: want allocated or reserved", f.fitOn)
	}
	conf := f.conf
	if conf == "" {
		conf = res.Spec.Sem.AllocConf // the recipe's cuda.alloc-conf (validated when set)
	}
	cfg, err := allocator.ParseConf(conf)
	if err != nil {
		return fmt.Errorf("--alloc-conf: %v", err)
	}
	if f.off {
		if decide || f.conf != "" {
			return fmt.Errorf("--no-reserved: cannot be combined with --fit-on reserved or --alloc-conf")
		}
		return nil
	}
	_, err = res.PredictReservedContext(ctx, cfg, decide, timeline)
	return err
}
