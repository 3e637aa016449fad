"""Builders used by the tests (MODULE:FUNCTION = builders:NAME)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _ce(out, y):
    return F.cross_entropy(out, y)


def wide_mlp(batch_size, d_in=256, hidden=512, classes=16):
    m = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return m, torch.randn(batch_size, d_in), _ce, torch.randint(0, classes, (batch_size,))


def mlp_sum_loss(batch_size):
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    return m, torch.randn(batch_size, 8), (lambda out, y: F.cross_entropy(out, y, reduction="sum")), \
        torch.randint(0, 4, (batch_size,))


class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if h.sum().item() > 0:  # reads a tensor value
            h = h * 2
        return h


def data_dependent(batch_size):
    return DataDependent(), torch.randn(batch_size, 8), None


class PerSampleLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.stack([self.fc(x[i]) for i in range(x.shape[0])])


def per_sample_loop(batch_size):
    return PerSampleLoop(), torch.randn(batch_size, 8), None


class Gate(nn.Module):
    def forward(self, h):
        return h[h > 0]  # output shape depends on values (nonzero)


class ValueShaped(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gate = Gate()

    def forward(self, x):
        return self.gate(self.fc(x))


def value_shaped(batch_size):
    return ValueShaped(), torch.randn(batch_size, 8), None


def exits_3(batch_size):
    """A builder that calls sys.exit (sweep G, B3): the exporter says so in one line, exit 1."""
    raise SystemExit(3)
