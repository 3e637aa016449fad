"""How autograd sums a parameter's gradients when several nodes read it, as PyTorch's own profiler counts it.

A parameter read by several nodes (a tied input embedding and LM head, or torchtune's LM head applied to each
of its output chunks) has one AccumulateGrad with an edge per reader: the engine keeps the first gradient in
that node's InputBuffer until the others arrive (torch/csrc/autograd/input_buffer.cpp, accumulate). A later
gradient is added in place when the buffer can be stolen (dense, the last reference to it and its storage:
the output of autocast's cast backward, or a sum made before), out of place when it cannot (linear's weight
gradient is a t() view that keeps its base): one more parameter-sized buffer, once per sum. From the second
micro-step of gradient accumulation on, the buffer lives beside .grad until AccumulateGrad adds it in.
lower.bufferGrad models this (ops.Rule.ViewGradIn); these are the counts it must match.
"""
import subprocess
import sys
import textwrap

import pytest
import torch

# PyTorch 1.13 (Debian's build, measured here) sums every later gradient out of place, the cast's and a sum's
# too (chunks: 3 of 3; tied under autocast: 1): the in-place path for dense tensors came with PyTorch 2.0
# (pytorch/pytorch#88339, November 2022). memplan's recipes model PyTorch 2's engine; autograd.inplace-sums=false
# models 1.x's (engine.TestOutOfPlaceSumsOfPyTorch1 holds these counts).
pytestmark = pytest.mark.skipif(int(torch.__version__.split(".")[0]) < 2, reason="PyTorch 1.x sums out of place")

V, H, T = 50000, 64, 32

SCRIPT = textwrap.dedent("""
    import torch, torch.nn as nn, torch.nn.functional as F
    from torch.profiler import profile, ProfilerActivity
    V, H, T = %(V)d, %(H)d, %(T)d
    case, dtype, accum = %(case)r, %(dtype)s, %(accum)r
    torch.manual_seed(0)
    W = nn.Parameter((torch.randn(V, H) * 0.01).to(dtype))
    hidden = torch.randn(1, T, H, dtype=dtype, requires_grad=True)
    idx = torch.randint(0, V, (1, T))
    unit = V * H * W.element_size()

    def step():
        if not accum:
            W.grad = None
        if case == "chunks":  # torchtune's chunked output: the head applied to 4 slices of the sequence
            outs = [F.linear(ch, W) for ch in hidden.chunk(4, dim=1)]
        elif case == "tied":
            outs = [F.linear(torch.tanh(F.embedding(idx, W)), W)]
        else:  # tied under autocast: the head reads a bfloat16 copy, whose backward casts a fresh gradient
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outs = [F.linear(torch.tanh(F.embedding(idx, W)), W)]
        loss = sum(o.float().logsumexp(-1).sum() for o in outs)
        del outs
        loss.backward()

    for it in range(3):  # the last step is measured: the first ones warm up
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
    big = [e for e in prof.events() if abs(e.self_cpu_memory_usage) >= unit // 2]
    print("out_of_place_sums", sum(1 for e in big if e.name == "aten::add" and e.self_cpu_memory_usage >= unit))
    print("accumulate_frees", sum(1 for e in big if e.name == "torch::autograd::AccumulateGrad" and e.self_cpu_memory_usage <= -unit))
""")


def measure(case, dtype, accum=False):
    r = subprocess.run([sys.executable, "-c", SCRIPT % dict(V=V, H=H, T=T, case=case, dtype=dtype, accum=accum)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr.decode()
    return dict((k, int(v)) for k, v in (line.split() for line in r.stdout.decode().strip().splitlines()))


@pytest.mark.parametrize("case,dtype,sums", [
    ("tied", "torch.float32", 1),      # the head's t() view, then the embedding's gradient: one sum out of place
    ("tied", "torch.bfloat16", 1),     # pure bf16 alike
    ("tied-amp", "torch.float32", 0),  # the cast's fresh gradient is stolen: summed in place
    ("chunks", "torch.float32", 1),    # four readers: the second sum out of place, the rest into that sum
    ("chunks", "torch.bfloat16", 1),
])
def test_sums_out_of_place(case, dtype, sums):
    assert measure(case, dtype)["out_of_place_sums"] == sums


@pytest.mark.parametrize("case", ["tied", "chunks"])
def test_accumulation_adds_the_sum_into_grad(case):
    # With .grad kept from the last micro-step, AccumulateGrad adds the summed buffer into it in place and
    # frees it: the buffer lived beside .grad through the backward.
    got = measure(case, "torch.float32", accum=True)
    assert got["accumulate_frees"] == 1 and got["out_of_place_sums"] == 1, got


# ---- the exporter records the sums as the plain step runs them ----

class _Tied(__import__("torch").nn.Module):
    """An embedding tied to its head, with a residual block and a norm between (GPT-2's shape): autograd sums
    the embedding's two gradients and the residual stream's two. The norm's gradient, fresh and dense, is the
    stream's first; the head's weight gradient, a t() view, the embedding's."""

    def __init__(self, vocab=512, hidden=32):
        import torch.nn as nn
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x):
        import torch
        import torch.nn.functional as F
        h = self.emb(x)
        h = self.norm(h + torch.tanh(self.mid(h)))
        return F.linear(h, self.emb.weight)


def _plain_sums(model, x, autocast):
    """(in place, out of place) sums of the plain step's backward, as torch.profiler sees them."""
    from torch.profiler import profile, ProfilerActivity
    import torch.nn.functional as F

    def step():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
        loss.backward()
    for _ in range(3):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
    ev = [e for e in prof.events() if e.name in ("aten::add", "aten::add_")]
    return sum(e.name == "aten::add_" for e in ev), sum(e.name == "aten::add" and e.self_cpu_memory_usage > 0 for e in ev)


@pytest.mark.parametrize("fake", [False, True])
def test_exporter_records_sums_as_the_plain_step(tmp_path, fake):
    # The recorder is a TorchDispatchMode, under which autograd treats every tensor as a subclass and sums
    # every gradient out of place (memplan_torch.trace._steals); it runs the sums the plain step runs in place
    # in place. The tied head's own gradient is a t() view: that sum stays out of place, as in the plain step.
    import torch.nn.functional as F
    from memplan_torch import export
    torch.manual_seed(0)
    model, x = _Tied(), torch.randint(0, 512, (2, 16))
    inplace, out_of_place = _plain_sums(model, x, autocast=False)
    # the residual stream's sum in place; the tied sum out of place, as the forward's residual add allocates
    assert (inplace, out_of_place) == (1, 2)
    doc = export(model, x, str(tmp_path / "t.json"), loss_fn=lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()),
                 targets=x.clone(), device="cpu", fake=fake)
    bwd = [e for e in doc["events"] if e["phase"] == "backward" and e["op"] in ("aten.add.Tensor", "aten.add_.Tensor")]
    assert [e["op"] for e in bwd] == ["aten.add_.Tensor", "aten.add.Tensor"], [(e["op"], e["module"]) for e in bwd]
    assert not bwd[0]["alloc"] and bwd[1]["alloc"][0]["bytes"] == 512 * 32 * 4
