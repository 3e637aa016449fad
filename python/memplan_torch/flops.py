"""FLOPs of one aten op, by PyTorch's own formulas: `torch.utils.flop_counter` (PyTorch 2.1 on), the table
`FlopCounterMode` counts with (matrix products, convolutions and their backward, fused attention). Other ops
(elementwise, reductions, copies) get none: memplan prices them on the bytes they move.

PyTorch's table names the CUDA fused-attention kernels but not the CPU one that CPU and fake tensors run
(`aten._scaled_dot_product_flash_attention_for_cpu` and its backward): their leading arguments are the same
(query, key, value; grad_out, query, key, value), so they are counted by the flash kernel's formula. The count
is of the shapes alone, so it is the same on real, meta and fake tensors.

PyTorch 1.13 has no such table: `available()` is False there and an export records no FLOPs (the document says
so in its `flops` field).
"""

import torch

try:  # PyTorch >= 2.1
    from torch.utils import flop_counter as _fc
except ImportError:  # pragma: no cover - torch 1.13
    _fc = None


def _table():
    if _fc is None or not hasattr(_fc, "flop_registry"):
        return None
    table = dict(_fc.flop_registry)
    aten = torch.ops.aten
    for cpu, like in (("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention"),
                      ("_scaled_dot_product_flash_attention_for_cpu_backward",
                       "_scaled_dot_product_flash_attention_backward")):
        op, ref = getattr(aten, cpu, None), getattr(aten, like, None)
        if op is not None and ref is not None and ref in table and op not in table:
            table[op] = table[ref]
    return table


_TABLE = _table()


def available():
    """Whether this PyTorch has FLOP formulas (an export records FLOPs)."""
    return _TABLE is not None


def source():
    """What the document's `flops` field says about where its counts come from."""
    if _TABLE is None:
        return "not recorded"
    return "torch.utils.flop_counter"


def op_flops(func, args, kwargs, out):
    """The FLOPs of `func(*args, **kwargs)` that returned `out`, or 0 when PyTorch counts none for it."""
    if _TABLE is None:
        return 0
    f = _TABLE.get(getattr(func, "overloadpacket", None))
    if f is None:
        return 0
    n = f(*args, **(kwargs or {}), out_val=out)
    return int(n) if n else 0
