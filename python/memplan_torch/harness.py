"""What a training step is, shared by the exporter, the measurer and the aligner.

A model builder is a function ``build(batch_size, **kw)`` returning
``(model, inputs, loss_fn)`` or ``(model, inputs, loss_fn, targets)``:

* ``inputs``: a tensor, a tuple/list of positional arguments, or a dict of keyword arguments of ``model``;
* ``loss_fn``: ``loss_fn(output)`` or, when targets are given, ``loss_fn(output, targets)``;
  ``None`` means ``output.sum()``;
* ``targets``: a tensor or a tuple/dict of tensors, moved to the device with the inputs.

One step is: ``loss = loss_fn(model(*inputs), targets)`` (the model output is not kept past the loss),
``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``.
"""

import importlib
import os
import sys

import torch

from . import compat

OPTIMIZERS = ("adamw", "sgd", "sgd-momentum")


class Job:
    def __init__(self, model, inputs, loss_fn=None, targets=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError("memplan_torch: the model must be a torch.nn.Module, got %s" % type(model).__name__)
        self.model = model
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        elif isinstance(inputs, list):
            inputs = tuple(inputs)
        if not isinstance(inputs, (tuple, dict)):
            raise TypeError("memplan_torch: inputs must be a tensor, a tuple/list or a dict, got %s"
                            % type(inputs).__name__)
        self.inputs = inputs
        self.loss_fn = loss_fn
        self.targets = targets

    def forward(self, inputs=None):
        inputs = self.inputs if inputs is None else inputs
        if isinstance(inputs, dict):
            return self.model(**inputs)
        return self.model(*inputs)

    def loss(self, out, targets=None):
        targets = self.targets if targets is None else targets
        if self.loss_fn is None:
            t = out
            while isinstance(t, (tuple, list)):
                t = t[0]
            if isinstance(t, dict):
                t = next(iter(t.values()))
            return t.sum()
        if targets is None:
            return self.loss_fn(out)
        return self.loss_fn(out, targets)

    def tensors(self):
        """Input and target tensors."""
        return [t for t in compat.flatten((self.inputs, self.targets)) if isinstance(t, torch.Tensor)]


def map_tensors(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_tensors(o, fn) for o in obj)
    if isinstance(obj, list):
        return [map_tensors(o, fn) for o in obj]
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _tied_parameters(model):
    """[(module, name), ...] groups that hold one Parameter object (a tied embedding and head)."""
    groups = {}
    for m in model.modules():
        for k, p in m._parameters.items():
            if p is not None:
                groups.setdefault(id(p), []).append((m, k))
    return [g for g in groups.values() if len(g) > 1]


def to_device(job, device, dtype=None):
    """Moves the job to `device` (and `dtype`), keeping tied parameters tied: Module.to makes a new Parameter
    per module where the new tensor cannot take over the old one's data (cpu -> meta), which unties them (a
    GPT-2 with a shared embedding and head gets both counted, updated and kept in optimizer state)."""
    ties = _tied_parameters(job.model)
    job.model.to(device)
    if dtype is not None:
        job.model.to(dtype)
    for group in ties:
        m0, k0 = group[0]
        for m, k in group[1:]:
            m._parameters[k] = m0._parameters[k0]

    def mv(t):
        t = t.to(device)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t

    job.inputs = map_tensors(job.inputs, mv)
    job.targets = map_tensors(job.targets, mv)
    return job


def make_optimizer(name, params, foreach=None):
    """adamw | sgd | sgd-momentum, an optimizer class, or a callable(params) -> optimizer."""
    params = list(params)
    if isinstance(name, str):
        kw = {} if foreach is None else {"foreach": bool(foreach)}
        if name == "adamw":
            return torch.optim.AdamW(params, lr=1e-3, **kw)
        if name == "sgd":
            return torch.optim.SGD(params, lr=1e-2, **kw)
        if name == "sgd-momentum":
            return torch.optim.SGD(params, lr=1e-2, momentum=0.9, **kw)
        raise ValueError("memplan_torch: unknown optimizer %r (choose one of: %s)" % (name, ", ".join(OPTIMIZERS)))
    if isinstance(name, type) and issubclass(name, torch.optim.Optimizer):
        return name(params, lr=1e-3)
    if callable(name):
        return name(params)
    raise ValueError("memplan_torch: optimizer must be one of %s, an Optimizer class or a callable, got %r"
                     % (", ".join(OPTIMIZERS), name))


def load_builder(spec):
    """'package.module:function' -> the function."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError("memplan_torch: model builder must be written MODULE:FUNCTION, got %r" % (spec,))
    mod, fn = spec.split(":", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError("memplan_torch: cannot import module %r of builder %r: %s" % (mod, spec, e))
    f = getattr(m, fn, None)
    if f is None or not callable(f):
        raise ValueError("memplan_torch: module %r has no function %r (builder %r)" % (mod, fn, spec))
    return f


def call_builder(builder, batch_size, seq_len=None, **extra):
    kw = dict(extra)
    if seq_len is not None:
        kw["seq_len"] = seq_len
    try:
        res = builder(batch_size, **kw)
    except SystemExit as e:
        # not an Exception: it would end the exporter with the builder's status and nothing said (sweep G, B3)
        raise RuntimeError("memplan_torch: the builder %s:%s exited (SystemExit(%s)) instead of returning "
                           "(model, inputs, loss_fn)" % (getattr(builder, "__module__", "?"),
                                                         getattr(builder, "__qualname__", "?"),
                                                         " ".join(repr(e.code).split())[:60]))
    if not isinstance(res, (tuple, list)) or len(res) not in (3, 4):
        raise ValueError("memplan_torch: a builder must return (model, inputs, loss_fn) or "
                         "(model, inputs, loss_fn, targets); got %s" % type(res).__name__)
    return Job(*res)


def scale_batch(obj, dim, factor):
    """Repeats every tensor with a dimension `dim` `factor` times along it."""
    def f(t):
        if t.dim() > dim:
            return torch.cat([t] * factor, dim=dim)
        return t
    return map_tensors(obj, f)


def narrow_seq(obj, dim, length):
    """Every tensor with a dimension `dim` cut to `length` along it, or tiled to it when shorter (the exporter
    fits sizes at lengths of 2 and more, also for inputs of 1)."""
    def f(t):
        if t.dim() > dim:
            if t.shape[dim] < length:
                t = torch.cat([t] * -(-length // t.shape[dim]), dim=dim)
            return t.narrow(dim, 0, length).contiguous()
        return t
    return map_tensors(obj, f)


def check_dims(inputs, batch_dim=0, seq_dim=None):
    """Refuses (ExportError, naming the flag and the inputs' rank) a batch or sequence dimension that no input
    tensor has: scaling or cutting along it would change nothing, and every size would be fitted as a constant."""
    from .trace import ExportError, InputDimError
    ranks = sorted({t.dim() for t in compat.flatten(inputs) if isinstance(t, torch.Tensor)})
    if not ranks:
        raise ExportError("memplan_torch: the model's inputs hold no tensor (a batch dimension needs one)")
    for flag, d in (("--batch-dim", batch_dim), ("--seq-dim", seq_dim)):
        if d is not None and d >= ranks[-1]:
            rank = "rank %d" % ranks[-1] if len(ranks) == 1 else "ranks %s" % ", ".join(map(str, ranks))
            raise InputDimError("memplan_torch: %s %d is out of range for the model's inputs (%s: dimensions 0 to %d)"
                              % (flag, d, rank, ranks[-1] - 1))


def batch_size_of(obj, dim):
    for t in compat.flatten(obj):
        if isinstance(t, torch.Tensor) and t.dim() > dim:
            return t.shape[dim]
    raise ValueError("memplan_torch: no input tensor has a batch dimension %d" % dim)


def chunk(obj, dim, k):
    """Splits every tensor with dimension `dim` into k equal views; returns a list of k structures."""
    def split(t):
        if t.dim() > dim:
            if t.shape[dim] % k:
                raise ValueError("memplan_torch: batch %d is not divisible by accumulation %d"
                                 % (t.shape[dim], k))
            return list(t.chunk(k, dim=dim))
        return [t] * k

    def rec(o, i):
        if isinstance(o, torch.Tensor):
            return split(o)[i]
        if isinstance(o, tuple):
            return tuple(rec(x, i) for x in o)
        if isinstance(o, list):
            return [rec(x, i) for x in o]
        if isinstance(o, dict):
            return {kk: rec(v, i) for kk, v in o.items()}
        return o

    return [rec(obj, i) for i in range(k)]


def to_fake(job, fake_mode):
    """Replaces the job's real parameters, buffers, inputs and targets by FakeTensors of `fake_mode` (same
    shapes, dtypes, devices, requires_grad; tied parameters stay tied, views of one storage stay views).
    Tensors already fake are kept."""
    memo = {}

    def conv(t):
        if compat.is_fake(t):
            return t
        f = memo.get(id(t))
        if f is None:
            f = fake_mode.from_tensor(t)
            memo[id(t)] = (f, t)  # keep t alive so its id is not reused
            return f
        return f[0]

    for m in job.model.modules():
        for k, p in list(m._parameters.items()):
            if p is not None and not compat.is_fake(p):
                if id(p) not in memo:
                    memo[id(p)] = (torch.nn.Parameter(fake_mode.from_tensor(p.detach()), requires_grad=p.requires_grad), p)
                m._parameters[k] = memo[id(p)][0]
        for k, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[k] = conv(b)
    job.inputs = map_tensors(job.inputs, conv)
    job.targets = map_tensors(job.targets, conv)
    return job
