"""torch.autocast's weight-cast cache, measured on CPU with the allocation tracker: what memplan's
strategy.AutocastCache models. The lower-precision copy of a trainable float32 parameter stays alive until the
outermost autocast region exits (aten/src/ATen/autocast_mode.cpp cached_cast; torch/amp/autocast_mode.py
autocast.__exit__), so under per-block torch.utils.checkpoint (reentrant or not), where the forward saves no copy,
leaving the region frees 2 bytes per trainable parameter; frozen parameters are not cached; without checkpointing
the weights' copies are saved for backward and only the biases' copies are freed at the exit."""

import json
import os
import subprocess
import sys

import pytest

from memplan_torch import compat, tracker

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)

# Four blocks of Linear(D, 4D), ReLU, Linear(4D, D) with a residual, at batch B x S; the loss in float32.
D, L, B, S = 256, 4, 4, 64
THRESHOLD = 1024  # the tracker's: fc2's 512-byte bfloat16 bias copies are under it

CHILD = r"""
import json, sys
import torch, torch.nn as nn, torch.utils.checkpoint as cp
from memplan_torch import tracker
D, L, B, S = %d, %d, %d, %d
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(s):
        super().__init__(); s.fc1 = nn.Linear(D, 4 * D); s.fc2 = nn.Linear(4 * D, D)
    def forward(s, x):
        return x + s.fc2(torch.relu(s.fc1(x)))

class Net(nn.Module):
    def __init__(s, mode):
        super().__init__(); s.blocks = nn.ModuleList(Block() for _ in range(L)); s.mode = mode
    def forward(s, x):
        for b in s.blocks:
            x = b(x) if s.mode == "none" else cp.checkpoint(b, x, use_reentrant=(s.mode == "reentrant"))
        return x.float().pow(2).mean()

c = tracker.counters()
out = {}
for mode in ("none", "non-reentrant", "reentrant"):
    for frozen in (False, True):
        for rep in range(2):  # the first run pays for lazy imports and first-use caches
            net = Net(mode)
            for p in net.parameters():
                p.requires_grad_(not frozen)
            # the blocks' input takes a gradient, as an embedding's output does (reentrant checkpoint needs one)
            x = torch.randn(B, S, D).requires_grad_()
            h = x * 1.0  # not a leaf: autocast does not cache its copy
            base = c.live()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = net(h)
                inside = c.live()
            drop = inside - c.live()
            loss.backward()
            del loss, net, x, h
        out["%%s/%%s" %% (mode, "frozen" if frozen else "trainable")] = drop
print(json.dumps(out))
""" % (D, L, B, S)


@pytest.fixture(scope="module")
def drops():
    if int(compat.TORCH_VERSION.split(".")[0]) < 2:  # pragma: no cover
        pytest.skip("measured on PyTorch 2.x's CPU autocast (torch %s)" % compat.TORCH_VERSION)
    env = tracker.preload_env(threshold=THRESHOLD, env=dict(os.environ, PYTHONPATH=PY_ROOT))
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


PARAMS = L * (2 * 4 * D * D + 4 * D + D)  # weights and biases of the blocks' linears
UNDER_THRESHOLD = L * D * 2  # fc2's bias copies: D bfloat16 elements each, under the tracker's threshold


@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_checkpointed_forward_holds_every_trainable_copy_until_the_region_exits(drops, mode):
    assert drops[mode + "/trainable"] == 2 * PARAMS - UNDER_THRESHOLD, drops
    assert drops[mode + "/frozen"] == 0, drops  # frozen parameters: nothing cached


def test_without_checkpointing_only_the_bias_copies_wait_for_the_exit(drops):
    # the weights' copies are saved for backward; fc1's bias copies (4D bfloat16 elements each) are not
    assert drops["none/trainable"] == L * 4 * D * 2, drops
    assert drops["none/frozen"] == 0, drops
