"""Builders of models the meta device used to trace wrongly (issue 10, item 6) and that fake execution must trace
as a real CPU step does: autocast inside forward, nn.LSTM (oneDNN's fused kernel on CPU), weight_norm (old and
parametrization API). GPT-2 with a tied head is memplan_torch.models:gpt2_tiny."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _ce(out, y):
    return F.cross_entropy(out, y)


class AutocastMLP(nn.Module):
    """A forward that runs under torch.autocast("cpu", bfloat16): the linears compute in bfloat16 (casts of
    the weights and the input, bf16 activations), the output is cast back to float32."""

    def __init__(self, d_in=64, hidden=256, classes=8):
        super().__init__()
        self.a = nn.Linear(d_in, hidden)
        self.b = nn.Linear(hidden, classes)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.b(torch.relu(self.a(x))).float()


def autocast_mlp(batch_size):
    return AutocastMLP(), torch.randn(batch_size, 64), _ce, torch.randint(0, 8, (batch_size,))


class LSTMClassifier(nn.Module):
    def __init__(self, vocab=100, d=32, hidden=48, layers=2, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.rnn = nn.LSTM(d, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        o, _ = self.rnn(self.embed(x))
        return self.head(o[:, -1])


def lstm(batch_size, seq_len=12):
    return LSTMClassifier(), torch.randint(0, 100, (batch_size, seq_len)), _ce, torch.randint(0, 5, (batch_size,))


class WeightNormMLP(nn.Module):
    def __init__(self, parametrization=False):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm if parametrization else nn.utils.weight_norm
        self.a = wn(nn.Linear(32, 64))
        self.b = nn.Linear(64, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def weight_norm(batch_size):
    """torch.nn.utils.weight_norm (a forward pre-hook recomputing `weight`, a non-leaf attribute)."""
    return WeightNormMLP(), torch.randn(batch_size, 32), _ce, torch.randint(0, 4, (batch_size,))


def weight_norm_parametrized(batch_size):
    """torch.nn.utils.parametrizations.weight_norm."""
    return WeightNormMLP(True), torch.randn(batch_size, 32), _ce, torch.randint(0, 4, (batch_size,))
