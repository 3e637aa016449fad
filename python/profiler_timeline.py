"""Record torch.profiler memory timelines of a small training step on CPU.

The test data of memplan's reader of `export_memory_timeline` files
(testdata/profiler/): torch.profiler.profile(profile_memory=True,
record_shapes=True, with_stack=True) around a few steps of a small
decoder-like model (embedding, two pre-norm MLP blocks with SiLU, a
vocabulary head, cross-entropy, AdamW), exported in the three data forms
torch/profiler/profiler.py (torch 2.14.1) writes by suffix:

  NAME.json          [times_us, sizes by category]   (_coalesce_timeline)
  NAME.json.gz       the same, gzipped
  NAME.raw.json.gz   [(time_ns, action, numbytes, category index), ...]

Usage (the torch2 venv, python/torch2_venv.sh):
  ~/.cache/memplan/venv-torch2/bin/python python/profiler_timeline.py testdata/profiler
"""

import os
import sys
import warnings

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, f)
        self.down = nn.Linear(f, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, vocab=512, d=128, f=512, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, f) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main(out):
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    ids = torch.randint(0, 512, (8, 64))
    labels = torch.randint(0, 512, (8, 64))

    def step():
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: AdamW creates its state
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        for _ in range(2):
            step()
    os.makedirs(out, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # export_memory_timeline is deprecated in 2.14
        for suffix in ("json", "json.gz", "raw.json.gz"):
            prof.export_memory_timeline(os.path.join(out, f"cpu_mlp_step.{suffix}"), device="cpu")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "testdata/profiler")
