package ckpt_test

import (
	"fmt"

	"github.com/memplan/memplan/search/ckpt"
)

func ExampleOptimal() {
	const MiB = 1 << 20
	// Four layers: attention is costly to recompute and saves little, the
	// MLPs are cheap and save a lot.
	blocks := []ckpt.Block{
		{Name: "attn0", Input: 64 * MiB, Saved: 160 * MiB, Forward: 3.0, Peak: 32 * MiB},
		{Name: "mlp0", Input: 64 * MiB, Saved: 512 * MiB, Forward: 1.0, Peak: 32 * MiB},
		{Name: "attn1", Input: 64 * MiB, Saved: 160 * MiB, Forward: 3.0, Peak: 32 * MiB},
		{Name: "mlp1", Input: 64 * MiB, Saved: 512 * MiB, Forward: 1.0, Peak: 32 * MiB},
	}
	none, _ := ckpt.Evaluate(blocks, ckpt.None(len(blocks)))
	fmt.Printf("no checkpointing: peak %d MiB; minimum: %d MiB\n", none/MiB, ckpt.MinPeak(blocks)/MiB)

	// Chen's √n rule keeps every ⌈√n⌉-th block and the last one.
	chen := ckpt.Chen(blocks)
	chenPeak, chenRecompute := ckpt.Evaluate(blocks, chen)
	fmt.Printf("chen    %s: peak %d MiB, recompute %.1f\n", chen, chenPeak/MiB, chenRecompute)

	// The optimum under a 1 GiB activation budget, lower than Chen's peak.
	p, err := ckpt.Optimal(blocks, 1024*MiB)
	if err != nil {
		fmt.Println(err)
		return
	}
	peak, recompute := ckpt.Evaluate(blocks, p)
	fmt.Printf("optimal %s: peak %d MiB, recompute %.1f\n", p, peak/MiB, recompute)

	_, err = ckpt.Optimal(blocks, 512*MiB)
	fmt.Println(err)
	// Output:
	// no checkpointing: peak 1376 MiB; minimum: 736 MiB
	// chen    C.C.: peak 1184 MiB, recompute 6.0
	// optimal .C..: peak 928 MiB, recompute 1.0
	// budget infeasible: budget 536870912 B is below the minimum achievable peak 771751936 B (every block checkpointed)
}
