package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/memplan/memplan/explain"
	"github.com/memplan/memplan/snapshot"
	"github.com/memplan/memplan/units"
)

// diagnoseSnapshot says which phase and which lifetime objects hit the
// device's line in a snapshot: at its recorded oom event, or replayed
// through the allocator model on --capacity bytes.
func diagnoseSnapshot(stdout io.Writer, path, capacity string, device int64, jsonOut bool) error {
	var c int64
	if capacity != "" {
		b, err := units.ParseBytes(capacity)
		if err != nil || b <= 0 {
			return fmt.Errorf("--capacity %q: want a size such as 12GiB or 16GB", capacity)
		}
		c = int64(b)
	}
	s, err := snapshot.ReadFile(path)
	if err != nil {
		return err
	}
	rep, err := explain.Explain(s, path, device)
	if err != nil {
		return explainFlagErr(err)
	}
	o, err := explain.DiagnoseOOM(s, rep, c)
	if err != nil {
		return explainFlagErr(err)
	}
	return emit(stdout, jsonOut,
		func(w io.Writer) error {
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(struct {
				Schema string `json:"schema"`
				File   string `json:"file"`
				Device int64  `json:"device"`
				*explain.OOM
			}{"memplan.diagnose-oom/v1", path, rep.Device, o})
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
}
