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
# too (chunks: 3 of 3; tied under autocast: 1); memplan models PyTorch 2's engine, as its recipes do.
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
