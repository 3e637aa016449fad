"""Feature detection across PyTorch 1.13 (Debian) and 2.x."""

import copy
import inspect

import torch
import torch.utils.checkpoint
from torch.multiprocessing.reductions import StorageWeakRef

try:  # 2.x
    from torch.utils._pytree import tree_flatten
except ImportError:  # pragma: no cover
    tree_flatten = None

TORCH_VERSION = torch.__version__


if hasattr(torch.Tensor, "untyped_storage"):
    def storage_of(t):
        """The untyped storage of a strided tensor."""
        return t.untyped_storage()
else:  # pragma: no cover - torch 1.13
    def storage_of(t):
        """The untyped storage of a strided tensor."""
        return t._storage()


def storage_key(st):
    """Identity of a StorageImpl (works on meta, where data_ptr is 0)."""
    return st._cdata


def weak_storage(st):
    return StorageWeakRef(st)


def _expired_fn():
    """A function cdata -> bool telling whether a StorageWeakRef's storage died, without StorageWeakRef.expired's
    two Python-level indirections (the recorder calls it for every live storage after every op)."""
    for owner in (getattr(torch, "UntypedStorage", None), getattr(torch, "_UntypedStorage", None), torch.Storage):
        f = getattr(owner, "_expired", None)
        if f is None:
            continue
        try:
            t = torch.zeros(1)
            ref = StorageWeakRef(storage_of(t))
            alive = f(ref.cdata)
            del t
            if alive is False and f(ref.cdata) is True:
                return f
        except Exception:  # pragma: no cover
            continue
    return None  # pragma: no cover


_EXPIRED = _expired_fn()


def storage_expired(ref):
    if _EXPIRED is not None:
        return _EXPIRED(ref.cdata)
    return ref.expired()  # pragma: no cover


def _death_callbacks():
    """Whether a Python weak reference to a storage object, with a callback, is called when the StorageImpl
    dies (PyTorch 2.x keeps one Python object per StorageImpl alive as long as the StorageImpl, "PyObject
    preservation"; torch 1.13 makes a fresh wrapper per call, which dies at once)."""
    import weakref
    try:
        dead = []
        t = torch.zeros(1)
        ref = weakref.ref(storage_of(t), lambda _: dead.append(1))
        alive_while_tensor = not dead and ref() is not None
        v = t.view(1)
        del t
        alive_while_view = not dead
        del v
        return alive_while_tensor and alive_while_view and dead == [1]
    except Exception:  # pragma: no cover
        return False


DEATH_CALLBACKS = _death_callbacks()


def on_storage_death(st, callback):
    """A weak reference to storage `st` that calls callback() once its StorageImpl dies, or None where that
    cannot be observed (DEATH_CALLBACKS false); the caller keeps the reference."""
    if not DEATH_CALLBACKS:
        return None
    import weakref
    return weakref.ref(st, lambda _: callback())


def dead_storages(records):
    """The records (objects with .ref, a StorageWeakRef) whose storage died."""
    f = _EXPIRED
    if f is not None:
        return [r for r in records if f(r.ref.cdata)]
    return [r for r in records if r.ref.expired()]  # pragma: no cover


def flatten(obj):
    if tree_flatten is not None:
        return tree_flatten(obj)[0]
    out = []

    def rec(o):
        if isinstance(o, (list, tuple)):
            for x in o:
                rec(x)
        elif isinstance(o, dict):
            for x in o.values():
                rec(x)
        else:
            out.append(o)

    rec(obj)
    return out


def checkpoint_supports_non_reentrant():
    try:
        sig = inspect.signature(torch.utils.checkpoint.checkpoint)
    except (TypeError, ValueError):  # pragma: no cover
        return False
    return "use_reentrant" in sig.parameters


def checkpoint_call(fn, *args, **kwargs):
    """Runs fn under activation checkpointing; returns (output, mode)."""
    if checkpoint_supports_non_reentrant():
        if kwargs:
            return torch.utils.checkpoint.checkpoint(lambda *a: fn(*a, **kwargs), *args, use_reentrant=False)
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    return torch.utils.checkpoint.checkpoint(lambda *a: fn(*a, **kwargs), *args)


def checkpoint_mode():
    return "non-reentrant" if checkpoint_supports_non_reentrant() else "reentrant"


def global_module_hooks_available():
    import torch.nn.modules.module as m
    return hasattr(m, "register_module_forward_pre_hook") and hasattr(m, "register_module_forward_hook")


def register_global_post_hook(hook):
    """A global module forward hook that also runs when the forward raises (torch 2.x `always_call`): torch
    2.x's non-reentrant checkpoint stops its recompute in backward with an exception as soon as the last
    saved tensor is recomputed, in the middle of a module's forward; without it the module-path stack keeps
    that module. torch 1.13 has no early stop (and no always_call)."""
    import torch.nn.modules.module as m
    try:
        return m.register_module_forward_hook(hook, always_call=True)
    except TypeError:
        return m.register_module_forward_hook(hook)


def warm_up_optimizer(make_optimizer, device, dtype):
    """Builds and steps a throwaway optimizer on one small parameter, so that what the first optimizer of a
    process initializes once is alive before a measurement takes its floor. torch 2.x imports torch._dynamo
    lazily when the first optimizer is built (its @_disable_dynamo decorators), and that import keeps about
    100 KB of tensor memory for the rest of the process (torch 2.14.1: 100,864 bytes): without this it would
    be counted as the workload's. torch 1.13 allocates nothing here."""
    p = torch.nn.Parameter(torch.zeros(16, device=device, dtype=dtype))
    opt = make_optimizer([p])
    p.grad = torch.ones_like(p)
    opt.step()
    zero_grad(opt)
    del opt, p


def zero_grad(optimizer):
    optimizer.zero_grad(set_to_none=True)


_DTYPE_NAMES = {}  # torch.dtype -> "float32" (the recorder names a dtype per output of every op)


def dtype_name(dt):
    n = _DTYPE_NAMES.get(dt)
    if n is None:
        n = _DTYPE_NAMES[dt] = str(dt).replace("torch.", "")
    return n


def parse_dtype(name):
    """The torch dtype a workload's dtype field names: its choices and aliases are the field table's
    (workload/fields.json), which the Go reader takes too."""
    from .workload import DTYPES, canonical
    n = canonical("dtype", name)
    if n not in DTYPES:
        raise ValueError("dtype %r is not one of %s" % (name, ", ".join(DTYPES)))
    return getattr(torch, n)


# ---- fake tensors (torch 2.x): tracing without computing ----

def fake_tensors_available():
    """FakeTensorMode exists and is usable for a training step (PyTorch 2.x; 1.13's is too incomplete:
    no saved_tensors_hooks on fake tensors, no fake storages to take weak references of)."""
    if int(torch.__version__.split(".")[0]) < 2:
        return False
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True


def new_fake_mode():
    """A FakeTensorMode whose tensors report the device they were made on (cpu) while holding only
    metadata: no data, no compute. Unsupported ops (no meta kernel, no decomposition) raise instead of
    running the real kernel on zeros, so a fake trace never spends real memory on an op."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_fallback_kernels=False)


_FAKE_TENSOR = []  # [FakeTensor], imported on first use (the recorder asks per op argument)


def is_fake(t):
    if not _FAKE_TENSOR:
        from torch._subclasses.fake_tensor import FakeTensor
        _FAKE_TENSOR.append(FakeTensor)
    return isinstance(t, _FAKE_TENSOR[0])


def deepcopy_module(model):
    """copy.deepcopy of a module that also copies modules with torch.nn.utils.weight_norm: that hook keeps the
    weight it computes (a non-leaf tensor, which deepcopy refuses: "Only Tensors created explicitly by the user
    (graph leaves) support the deepcopy protocol") as a plain attribute and recomputes it before every forward,
    so the copy gets it detached."""
    memo = {}
    for m in model.modules():
        for v in m.__dict__.values():
            if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and v.grad_fn is not None:
                memo[id(v)] = v.detach().clone()
    return copy.deepcopy(model, memo)
