"""Models with a size-1 specialisation in PyTorch (issue 16): at a batch (or sequence) of 1 some op is a view, or
no op at all, where at every larger size it is a copy, or takes another path. test_size1.py checks each one
really specialises at 1 and exports at 1 all the same; and that real structural differences are refused."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class _Net(nn.Module):
    def __init__(self, middle, d=16, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.mid = middle
        self.fc2 = nn.Linear(d, classes)

    def forward(self, x):
        return self.fc2(self.mid(torch.relu(self.fc1(x))))


class ViewOrClone(nn.Module):
    """reshape of a transposed [B, D]: a view at B = 1 ([D, 1] is contiguous), clone + _unsafe_view above."""

    def forward(self, h):
        b, d = h.shape
        return h.t().reshape(d * b).reshape(d, b).t() * 2


class ContiguousNoop(nn.Module):
    """.contiguous() of a transposed [B, D]: nothing at B = 1, a clone above."""

    def forward(self, h):
        return torch.tanh(h.t().contiguous()).t()


class ExpandReshape(nn.Module):
    """the batch mean expanded over the batch, then flattened: a view at B = 1 (the stride-0 dimension has size
    1), a copy above."""

    def forward(self, h):
        b, d = h.shape
        m = h.mean(0, keepdim=True).expand(b, d).reshape(b * d)
        return h + m.reshape(b, d)


class Squeeze(nn.Module):
    """squeeze() drops the batch dimension at B = 1: the linear runs on a vector (another op path)."""

    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, h):
        b = h.shape[0]
        return self.lin(h.squeeze()).reshape(b, -1)


class SeqViewOrClone(nn.Module):
    """[B, S, D] -> transpose(1, 2) -> reshape(B, D * S): a view at S = 1, a copy above (the sequence dimension)."""

    def forward(self, h):
        b, s, d = h.shape
        return h.transpose(1, 2).reshape(b, d * s).reshape(b, d, s).transpose(1, 2) * 2


class SizeBranch(nn.Module):
    """Not a specialisation: different ops above a batch of 2 (data-shape-dependent control flow)."""

    def forward(self, h):
        return torch.sigmoid(h) if h.shape[0] > 2 else torch.tanh(h)


class SizeLifetime(nn.Module):
    """Not a specialisation: keeps a tensor for backward only above a batch of 2 (the same ops, other lifetimes)."""

    def forward(self, h):
        if h.shape[0] > 2:
            return h * h  # saves h
        return h * 2.0  # saves nothing


def _job(middle, batch_size, d=16, classes=4):
    torch.manual_seed(0)
    return (_Net(middle, d, classes), torch.randn(batch_size, d), F.cross_entropy,
            torch.randint(0, classes, (batch_size,)))


def view_or_clone(batch_size):
    return _job(ViewOrClone(), batch_size)


def contiguous_noop(batch_size):
    return _job(ContiguousNoop(), batch_size)


def expand_reshape(batch_size):
    return _job(ExpandReshape(), batch_size)


def squeeze(batch_size):
    return _job(Squeeze(), batch_size)


def size_branch(batch_size):
    return _job(SizeBranch(), batch_size)


def size_lifetime(batch_size):
    return _job(SizeLifetime(), batch_size)


class _SeqNet(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.mid = SeqViewOrClone()
        self.fc2 = nn.Linear(d, d)

    def forward(self, x):
        return self.fc2(self.mid(torch.relu(self.fc1(x))))


def seq_view_or_clone(batch_size, seq_len=8, d=16):
    torch.manual_seed(0)
    return _SeqNet(d), torch.randn(batch_size, seq_len, d), None


class HalfViewOrClone(nn.Module):
    """A dimension of 1 inside the model at a traced batch of 2: the first half of the batch goes through a
    reshape of its transpose, a view at batch 2 (a half of 1), clone + _unsafe_view at 4 and above."""

    def forward(self, h):
        b, d = h.shape
        g = h[: b // 2]
        k = g.t().reshape(d * (b // 2)).reshape(d, b // 2).t()
        return torch.cat([k, k]) * 2


class HalfExpandRepeat(nn.Module):
    """expand vs repeat: h[:b//2] repeated twice where its rows are 1 (repeat) — expand + reshape at 2 (a view)
    and a copy at 4."""

    def forward(self, h):
        b, d = h.shape
        g = h[: b // 2].mean(0, keepdim=True)
        return h + g.expand(b, d).reshape(b * d).reshape(b, d)


def half_view_or_clone(batch_size):
    return _job(HalfViewOrClone(), batch_size)


def half_expand(batch_size):
    return _job(HalfExpandRepeat(), batch_size)
