package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/explain"
	"github.com/memplan/memplan/snapshot"
	"github.com/memplan/memplan/units"
)

// replayDevice is the device diagnose SNAPSHOT replays a snapshot on:
// bytes (0: none, the snapshot's own oom event), and the --gpu that gave
// them, if one did.
type replayDevice struct {
	bytes int64
	gpu   string
}

// snapshotCapacity reads --capacity, or --gpu: the GPU's memory less the
// CUDA context, as plan counts what one process's allocator can reserve
// there (hw.GPU.Capacity less the hf recipe's cuda.overhead: the snapshot
// does not say which framework ran, and pack counts a snapshot's process
// the same way).
func snapshotCapacity(capacity, gpu string) (replayDevice, error) {
	switch {
	case capacity != "" && gpu != "":
		return replayDevice{}, fmt.Errorf("give --capacity or --gpu, not both: each is the device to replay on")
	case capacity != "":
		b, err := units.ParseBytes(capacity)
		if err != nil || b <= 0 {
			return replayDevice{}, fmt.Errorf("--capacity %q: want a size such as 12GiB or 16GB", capacity)
		}
		return replayDevice{bytes: int64(b)}, nil
	case gpu != "":
		g, err := lookupGPU(gpu)
		if err != nil {
			return replayDevice{}, err
		}
		s := engine.Spec{Target: engine.Target{GPU: g}}
		r, err := loadRecipe("hf")
		if err == nil {
			err = r.Apply(&s, nil)
		}
		if err != nil {
			return replayDevice{}, err
		}
		return replayDevice{int64(s.CapacityBytes()), gpu}, nil
	}
	return replayDevice{}, nil
}

// diagnoseSnapshot says which phase and which lifetime objects hit the
// device's line in a snapshot: at its recorded oom event, or replayed
// through the allocator model on dev's bytes.
func diagnoseSnapshot(ctx context.Context, stdout io.Writer, path string, dev replayDevice, device int64, jsonOut bool) error {
	if ctx == nil {
		ctx = context.Background()
	}
	s, err := snapshot.ReadFile(path)
	if errors.Is(err, snapshot.ErrTimelineForm) {
		return fmt.Errorf("%s is not a snapshot pickle (JSON, gzip or HTML, as torch.profiler's memory timeline): diagnose replays a snapshot's allocations, which a timeline does not record; for its peak run memplan explain %s", path, path)
	}
	if err != nil {
		return err
	}
	rep, err := explain.ExplainContext(ctx, s, path, device)
	if err != nil {
		return explainFlagErr(err)
	}
	o, err := explain.DiagnoseOOMContext(ctx, s, rep, dev.bytes)
	if ce := (*explain.CapacityError)(nil); errors.As(err, &ce) && ce.Capacity > 0 {
		return snapshotFits(stdout, jsonOut, path, rep.Device, dev, ce)
	}
	if err != nil {
		return explainFlagErr(err)
	}
	err = emit(stdout, jsonOut,
		func(w io.Writer) error {
			return encodeDiagnosis(w, struct {
				diagnosisHead
				*explain.OOM
			}{diagnosisHead{diagnoseOOMSchema, path, rep.Device, false}, o})
		},
		func(w io.Writer) error {
			fmt.Fprintln(w, o.Paragraph)
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
			for _, part := range []struct {
				title  string
				shares []explain.Share
			}{{"alive by category:", o.Live.ByCategory}, {"by lifetime:", o.Lifetimes}, {"by code site:", o.Live.BySite}} {
				fmt.Fprintf(w, "\n%s\n", part.title)
				for _, sh := range part.shares {
					fmt.Fprintf(tw, "  %s\t%s\t\n", sh.Name, units.Bytes(sh.Bytes))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	// The run ran out (recorded, or replayed on the device given): the
	// report is printed and the status says it does not fit, as plan's.
	return verdict(ExitDoesNotFit)
}

// snapshotFits reports a replay that never runs out on the device given:
// nothing to diagnose, and not bad input, so status 0 with one line (or
// the JSON) saying it fits and how much the allocator model reserves.
func snapshotFits(stdout io.Writer, jsonOut bool, path string, device int64, dev replayDevice, ce *explain.CapacityError) error {
	where := fmt.Sprintf("%s (--capacity)", ce.Capacity)
	if dev.gpu != "" {
		where = fmt.Sprintf("%s (--gpu %s: its memory less the CUDA context)", ce.Capacity, dev.gpu)
	}
	summary := fmt.Sprintf("%s fits in %s: replayed through the allocator model, it reserves at most %s and never runs out, so there is no out-of-memory to diagnose.", path, where, ce.Reserved)
	return emit(stdout, jsonOut,
		func(w io.Writer) error {
			return encodeDiagnosis(w, struct {
				diagnosisHead
				Capacity int64  `json:"capacity_bytes"`
				Reserved int64  `json:"reserved_bytes"`
				Summary  string `json:"summary"`
			}{diagnosisHead{diagnoseOOMSchema, path, device, true}, int64(ce.Capacity), int64(ce.Reserved), summary})
		},
		func(w io.Writer) error {
			_, err := fmt.Fprintln(w, summary)
			return err
		})
}

// diagnoseOOMSchema and diagnosisHead open the JSON of diagnose SNAPSHOT,
// whether the run ran out or fits.
const diagnoseOOMSchema = "memplan.diagnose-oom/v1"

type diagnosisHead struct {
	Schema string `json:"schema"`
	File   string `json:"file"`
	Device int64  `json:"device"`
	Fits   bool   `json:"fits"`
}

func encodeDiagnosis(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}
