"""Builders for test_hold_outputs.py."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def wide_head(batch_size):
    """A head wider than the body: the logits ([batch, 2048] float32, 8 KiB a sample) are what a loop that keeps
    the model's output holds; cross_entropy saves its log_softmax, not the logits, so a loop that drops them frees
    them once the loss exists."""
    m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2048))
    return m, torch.randn(batch_size, 64), F.cross_entropy, torch.randint(0, 2048, (batch_size,))
