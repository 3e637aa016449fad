package cli

import (
	"fmt"
	"io"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/spf13/cobra"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
)

// modelRow is one catalog model in `memplan models -o json`
// (memplan.models/v1).
type modelRow struct {
	Name    string `json:"name"`
	Family  string `json:"family"`
	Params  int64  `json:"params"`
	Layers  int    `json:"layers"`
	Hidden  int    `json:"hidden"`
	Heads   int    `json:"heads"`
	KVHeads int    `json:"kv_heads"`
	Experts int    `json:"experts,omitempty"`
	Vocab   int    `json:"vocab"`
	Context int    `json:"max_positions"`
	Repo    string `json:"source"`
}

func newModelsCmd(stdout io.Writer) *cobra.Command {
	var jsonOut bool
	c := &cobra.Command{
		Use:   "models",
		Short: "List the embedded model catalog",
		Long: "List the embedded model catalog. The params column is the published checkpoint's module, tied weights\n" +
			"counted once (the *ForCausalLM class; BertModel with its pooler; ViT as its config's architectures says).\n" +
			"plan trains an encoder without a classification head with one of num_labels (default 2, as\n" +
			"BertForSequenceClassification), so plan's params add hidden × labels + labels (1,538 for bert-base).",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var rows []modelRow
			for _, e := range models.Catalog() {
				a, err := models.Lookup(e.Name)
				if err != nil {
					return err
				}
				rows = append(rows, modelRow{Name: e.Name, Family: a.Family, Params: a.ParamCount(), Layers: a.Layers, Hidden: a.Hidden,
					Heads: a.Heads, KVHeads: a.KVHeads, Experts: a.NumExperts, Vocab: a.Vocab, Context: a.MaxPositions, Repo: e.Repo})
			}
			if jsonOut {
				return writeJSON(stdout, struct {
					Schema string     `json:"schema"`
					Models []modelRow `json:"models"`
				}{"memplan.models/v1", rows})
			}
			t := table.NewWriter()
			t.SetStyle(table.StyleLight)
			t.AppendHeader(table.Row{"name", "family", "params", "", "layers", "hidden", "heads (kv)", "source"})
			for _, r := range rows {
				t.AppendRow(table.Row{r.Name, r.Family, models.HumanCount(r.Params), commas(r.Params), r.Layers, r.Hidden, fmt.Sprintf("%d (%d)", r.Heads, r.KVHeads), r.Repo})
			}
			t.SetColumnConfigs([]table.ColumnConfig{{Number: 3, Align: text.AlignRight}, {Number: 4, Align: text.AlignRight}})
			_, err := fmt.Fprintln(stdout, t.Render())
			return err
		},
	}
	outputFlags(c.Flags(), &jsonOut, "print the catalog as JSON (memplan.models/v1)")
	return c
}

// gpuRow is one catalog GPU in `memplan gpus -o json` (memplan.gpus/v1):
// datasheet memory and the torch-visible total both in bytes, throughputs
// in TFLOP/s (dense), bandwidths in GB/s.
type gpuRow struct {
	Name              string   `json:"name"`
	Vendor            string   `json:"vendor"`
	Aliases           []string `json:"aliases,omitempty"`
	Memory            int64    `json:"memory_bytes"`
	TotalMemory       int64    `json:"total_memory_bytes"`
	FP32              float64  `json:"fp32_tflops"`
	TF32              float64  `json:"tf32_tflops,omitempty"`
	BF16              float64  `json:"bf16_tflops,omitempty"`
	FP16              float64  `json:"fp16_tflops"`
	FP8               float64  `json:"fp8_tflops,omitempty"`
	MemBandwidth      float64  `json:"mem_bandwidth_gbs"`
	HostLink          string   `json:"host_link"`
	HostLinkGBs       float64  `json:"host_link_gbs_per_direction"`
	NVLink            float64  `json:"nvlink_gbs,omitempty"`
	Node              *nodeRow `json:"node,omitempty"`
	MIG               *migRow  `json:"mig,omitempty"`
	Source            string   `json:"source"`
	TotalMemorySource string   `json:"total_memory_source"`
}

// migRow is a Multi-Instance GPU profile's place in its GPU: the whole
// GPU's catalog name, the profile, its SMs of the GPU's and its fraction of
// the memory (the figures the time model scales by).
type migRow struct {
	Parent         string  `json:"parent"`
	Profile        string  `json:"profile"`
	SMs            int     `json:"sms"`
	ParentSMs      int     `json:"parent_sms"`
	MemoryFraction float64 `json:"memory_fraction"`
}

// nodeRow is the server a catalog GPU is sold in: GPUs per node and each
// GPU's network to other nodes (Gb/s per direction), with its source.
type nodeRow struct {
	GPUs        int     `json:"gpus"`
	NetworkGbps float64 `json:"network_gbps"`
	Source      string  `json:"source"`
}

func newGPUsCmd(stdout io.Writer) *cobra.Command {
	var jsonOut bool
	c := &cobra.Command{
		Use:   "gpus",
		Short: "List the embedded GPU catalog",
		Long: "List the embedded GPU catalog. \"datasheet\" is the capacity the vendor prints (decimal GB); " +
			"\"usable\" is what a process can allocate (torch's total_memory, GiB); plans are checked against it less the CUDA context and NCCL buffers the recipe counts (what plan prints as usable). " +
			"MIG profiles are entries <gpu>-mig-<profile> (e.g. h100-80gb-mig-3g.40gb): the instance's memory, " +
			"the compute of its share of the SMs and the bandwidth of its share of the memory.",
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if jsonOut {
				var rows []gpuRow
				for _, g := range hw.All() {
					rows = append(rows, gpuRow{Name: g.Name, Vendor: g.Vendor, Aliases: g.Aliases, Memory: int64(g.Memory), TotalMemory: int64(g.Capacity()),
						FP32: g.FP32 / 1e12, TF32: g.TF32 / 1e12, BF16: g.BF16 / 1e12, FP16: g.FP16 / 1e12, FP8: g.FP8 / 1e12,
						MemBandwidth: g.MemBandwidth / 1e9, HostLink: g.HostLink.String(), HostLinkGBs: g.HostLink.PerDirection / 1e9,
						NVLink: g.NVLink / 1e9, Source: g.Source, TotalMemorySource: g.TotalMemorySource})
					if n := g.Node; n != nil {
						rows[len(rows)-1].Node = &nodeRow{GPUs: n.GPUs, NetworkGbps: n.NetworkPerDirection * 8 / 1e9, Source: n.Source}
					}
					if m := g.MIG; m != nil {
						rows[len(rows)-1].MIG = &migRow{Parent: m.Parent, Profile: m.Profile, SMs: m.SMs, ParentSMs: m.ParentSMs, MemoryFraction: m.MemoryFraction}
					}
				}
				return writeJSON(stdout, struct {
					Schema string   `json:"schema"`
					GPUs   []gpuRow `json:"gpus"`
				}{"memplan.gpus/v1", rows})
			}
			t := table.NewWriter()
			t.SetStyle(table.StyleLight)
			t.AppendHeader(table.Row{"name", "datasheet", "usable", "bf16 TFLOP/s", "HBM GB/s", "host link", "NVLink GB/s"})
			for _, g := range hw.All() {
				bf := "-"
				if g.BF16 > 0 {
					bf = fmt.Sprintf("%.1f", g.BF16/1e12)
				}
				nv := "-"
				if g.NVLink > 0 {
					nv = fmt.Sprintf("%.0f", g.NVLink/1e9)
				}
				t.AppendRow(table.Row{g.Name, fmt.Sprintf("%.0f GB", float64(g.Memory)/1e9), g.Capacity().String(), bf, fmt.Sprintf("%.0f", g.MemBandwidth/1e9), g.HostLink.String(), nv})
			}
			t.SetColumnConfigs([]table.ColumnConfig{{Number: 2, Align: text.AlignRight}, {Number: 4, Align: text.AlignRight}, {Number: 5, Align: text.AlignRight}})
			_, err := fmt.Fprintln(stdout, t.Render())
			return err
		},
	}
	outputFlags(c.Flags(), &jsonOut, "print the catalog as JSON (memplan.gpus/v1)")
	return c
}
