"""Generates replace_state.trace.json: a tiny MLP whose hand-written optimizer REPLACES its state each step
(m = 0.9*m + g stored back into a dict, then p -= lr*m) instead of updating it in place, so the steady step
frees the initial state storages and the first step creates state lazily under ids that are initial in the
steady step (issue 10, item 6).

  cd python && PYTHONPATH=. /usr/bin/python3 ../testdata/torch/replace_state.py ../testdata/torch/replace_state.trace.json
"""

import sys

import torch
import torch.nn as nn

from memplan_torch import harness
from memplan_torch.export import build_trace, write_json


class ReplaceMomentum(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-2):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "m" not in st:
                    st["m"] = torch.zeros_like(p)
                st["m"] = 0.9 * st["m"] + p.grad  # a new tensor; the old state is dropped
                p.data -= g["lr"] * st["m"]


def make_job(batch, seq=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    x = torch.randn(batch, 64)
    y = torch.randint(0, 32, (batch,))
    return harness.Job(model, x, nn.CrossEntropyLoss(), y)


if __name__ == "__main__":
    doc = build_trace(make_job, 4, optimizer=ReplaceMomentum, device="cpu", foreach=None,
                             name="replace_state", source="testdata/torch/replace_state.py:make_job")
    doc["producer"]["elapsed_s"] = 0.0
    write_json(doc, sys.argv[1])
