"""Records one training step at the aten-op level (a TorchDispatchMode).

For each op: its overload name, phase, module path, the storages its outputs allocate (new StorageImpls)
or alias (views, in-place), the storages freed since the previous op (a sweep of weak references after
every op), and the storages autograd saves for backward (a saved_tensors_hooks pack hook).

Storages are identified by their StorageImpl (``storage._cdata``), which works on the meta device where
every data pointer is 0; a weak reference to the StorageImpl tells when it is freed.

Fake execution (PyTorch 2.x, ``fake=True``): the step runs on FakeTensors under a FakeTensorMode that sits
below the recorder on the mode stack. A FakeTensor reports its device (cpu), so composite ops decompose as
they do on that device, but it holds only a meta storage: StorageImpl identity, views, in-place writes, frees
and saved_tensors_hooks work as for real tensors, and nothing is computed or allocated.
"""

import contextlib

import torch
import torch.nn.modules.module as module_mod
from torch.utils._python_dispatch import TorchDispatchMode

from . import collector, compat, flops, harness

PHASES = ("forward", "backward", "optimizer")


class ExportError(RuntimeError):
    """A model the exporter cannot trace; the message names the op or module and what to do."""


class InputDimError(ExportError):
    """A --batch-dim or --seq-dim that no input tensor has (harness.check_dims): no other device or a real build
    changes it, so the exporter's fallbacks re-raise it."""


def _seal(ev):
    """Freezes an event no later op can change (the recorder appends only to the last one) into tuples: a
    tuple of ints, and a dict holding only those, leave the garbage collector's tracking, so its full
    collections, which visit every tracked object, do not grow with the trace (with lists, they made the
    export of a 400-layer stack take 9.4x the time of 50 layers instead of 8x; issue 15)."""
    for f in ("alloc", "free", "saved", "inputs"):
        ev[f] = tuple(ev[f])
    for o in ev["outputs"]:
        o["shape"] = tuple(o["shape"])
    ev["outputs"] = tuple(ev["outputs"])


class _Storage:
    __slots__ = ("sid", "key", "ref", "nbytes", "dtype", "shape", "category", "saved", "module", "phase",
                 "op", "event", "buffer", "preexisting", "freed_event", "death")

    def __init__(self, sid, key, ref, nbytes, dtype, shape, module, phase, op, event):
        self.sid = sid
        self.key = key
        self.ref = ref
        self.nbytes = nbytes
        self.dtype = dtype
        self.shape = shape
        self.category = None  # set for parameter/gradient/optimizer_state/input; else derived
        self.saved = False
        self.module = module
        self.phase = phase
        self.op = op
        self.event = event
        self.buffer = False
        self.preexisting = False
        self.freed_event = None
        self.death = None  # the weak reference whose callback reports the storage's death (torch 2.x)


class _HookProxy:
    """A wrapped saved-tensors hook; other attributes read through to the hook it wraps (torch 2.x checkpointing
    marks its hooks with attributes it reads back from the pushed pair)."""

    def __init__(self, fn, call):
        self._fn = fn
        self._call = call

    def __call__(self, x):
        return self._call(x)

    def __getattr__(self, name):
        return getattr(self.__dict__["_fn"], name)


class _Packed:
    __slots__ = ("t", "module", "version")

    def __init__(self, t, module):
        self.t = t
        self.module = module
        self.version = t._version if isinstance(t, torch.Tensor) else None


# Under saved_tensors_hooks autograd hands backward what unpack returns and checks no version counter, so a
# step PyTorch refuses (a tensor saved for backward, then modified in place) would be recorded and planned;
# unpack makes the check autograd makes without hooks (sweep G, round 25).
_MODIFIED = ("memplan_torch: a tensor saved for backward in module %r was modified by an in-place operation before "
             "backward used it (its version is %d, it was %d when saved): PyTorch refuses this step (\"one of the "
             "variables needed for gradient computation has been modified by an inplace operation\"); fix the model")


_LIFT = ("aten.lift_fresh.default",)
_LOCAL_SCALAR = "aten._local_scalar_dense.default"


class _Op:
    """What the recorder needs to know of an OpOverload, worked out once per overload (str() of an OpOverload
    formats it anew each time, and its schema is a C++ object): about a third of the recorder's own time per op
    went to asking these again for every call."""
    __slots__ = ("name", "passthrough", "lift", "real_sized", "local_scalar", "returns_tensor")

    def __init__(self, func):
        self.name = name = str(func)
        # prim.device & co. are metadata queries FakeTensors route through the dispatcher
        self.passthrough = name.startswith(("profiler.", "prim."))
        self.lift = name in _LIFT
        self.real_sized = name in _REAL_SIZED
        self.local_scalar = name == _LOCAL_SCALAR
        self.returns_tensor = _returns_tensor(func)


_OPS = {}  # OpOverload -> _Op

_ADD, _ADD_ = torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor


def _steals(args, kwargs):
    """Whether autograd's engine, run without a dispatch mode, would sum a gradient into the one its InputBuffer
    holds in place: torch/csrc/autograd/input_buffer.cpp (accumulate) adds `old_var.add_(var)` when
    can_accumulate_inplace(old_var), else computes `old_var + var`. Under any TorchDispatchMode, as under the
    recorder, at::isTensorSubclassLike is true for every tensor (ATen/TensorSubclassLikeUtils.h:
    `if (c10::impl::dispatch_mode_enabled()) return true;`), so the check fails and a trace would record every
    sum out of place. The check asks for a vanilla, dense tensor that holds the last reference to itself and
    to its storage; a view keeps its base, and so its storage, alive (linear's weight gradient, a t() view),
    so a view is summed out of place. PyTorch 1.x sums every gradient out of place (measured on 1.13)."""
    if not _TORCH2 or kwargs or len(args) != 2:
        return False
    old, var = args
    return (isinstance(old, torch.Tensor) and isinstance(var, torch.Tensor) and old.layout == torch.strided
            and not old._is_view() and old.is_contiguous() and old.dtype == var.dtype and old.shape == var.shape
            and old.device == var.device and not old.requires_grad)


def _tensors(seq, out):
    """Appends the tensors of an op's arguments or outputs (tensors, lists/tuples of them, scalars; no dicts
    inside aten signatures) to `out`, in order; a pytree-free compat.flatten for the recorder's hot path."""
    for a in seq:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            _tensors(a, out)
    return out

# Ops whose meta kernel (what a FakeTensor runs) does not give the outputs the real CPU kernel gives. oneDNN's
# LSTM (what nn.LSTM runs on CPU in training): `aten.mkldnn_rnn_layer` returns a workspace that backward reads,
# which its meta kernel (torch/_meta_registrations.py, meta_mkldnn_rnn_layer) returns empty while its size is
# oneDNN's own function of the shapes (90,112 bytes for 12 steps x batch 2 x hidden 48); the meta kernel of
# `aten.mkldnn_rnn_layer_backward` returns one tensor as both bias gradients, where the real kernel returns two
# (and FakeTensorMode's dispatch cache, on a hit, two as well). Under fake execution such an op is run once for
# real on zeros of the same shapes (memoized per shapes and arguments), and its fake outputs are made to have
# the real ones' sizes, strides and storage sharing. `aten.native_layer_norm_backward` on CPU returns its input
# gradient contiguous (aten/src/ATen/native/layer_norm.cpp, layer_norm_backward_cpu: empty_like(X, ...,
# MemoryFormat::Contiguous)) where the meta kernel gives it the output gradient's strides: with a permuted output
# gradient (torchvision's Swin: permute + adaptive_avg_pool2d after the final norm) the next reshape is a view
# for real but a clone + _unsafe_view fake (3 events more, another temporary).
_REAL_SIZED = ("aten.mkldnn_rnn_layer.default", "aten.mkldnn_rnn_layer_backward.default",
               "aten.native_layer_norm_backward.default")

# Values a real step reads from a tensor (`bool(t)`, `t.item()`: aten._local_scalar_dense) that a fake step is told,
# in order, by code that knows them (hf.real_mask_decisions: transformers' packed-sequence check, whose answer for
# the model's own arange position ids is known): the read is recorded as the real step records it and returns the
# value instead of failing under fake tensors. Empty outside such code.
_ANSWERS = []


@contextlib.contextmanager
def answered_reads(*values):
    """The next len(values) value reads of a fake step return these values (see _ANSWERS); all must be read."""
    n = len(_ANSWERS)
    _ANSWERS.extend(values)
    try:
        yield
    finally:
        left = len(_ANSWERS) - n
        del _ANSWERS[n:]
        if left > 0:
            raise AssertionError("memplan_torch: %d answered value read(s) not made" % left)


class Recorder(TorchDispatchMode):
    def __init__(self, device, fake=False):
        super().__init__()
        self.device = str(device)
        self.fake = bool(fake)
        self.meta = self.device == "meta"
        self.storages = []  # by sid
        self.live = {}  # key -> _Storage
        self.events = []
        self.phase = "setup"
        self.step = 0
        self.stack = []  # module path stack (forward hooks)
        self.names = {}  # id(module) -> qualified name
        self.bwd_module = ""
        self.loss_region = False
        self.pending_saved = []
        self.recording = True
        self.unseen = []  # storages first seen as inputs since the last event
        # storages whose death a weak-reference callback reported since the last sweep (torch 2.x): a sweep
        # costs what died, not what lives, so the export is linear in the number of ops; torch 1.13 cannot
        # report deaths and every sweep checks every live storage (compat.DEATH_CALLBACKS)
        self.died = []
        self.track_deaths = compat.DEATH_CALLBACKS
        # between one autograd node's end and the next one's start (hook_backward): the engine's own work, where
        # an aten.add is autograd summing a tensor's gradients in its InputBuffer
        self.engine_gap = False
        # in-kernel buffers (oneDNN scratch, ...) are only visible to the allocator tracker, on CPU
        self.counters = None
        if self.device == "cpu" and not self.fake:
            from . import tracker
            self.counters = tracker.counters()

    # ---- storage bookkeeping ----
    def _new_storage(self, t, st, module, op, event):
        key = compat.storage_key(st)
        rec = _Storage(len(self.storages), key, compat.weak_storage(st), int(st.nbytes()),
                       compat.dtype_name(t.dtype), tuple(t.shape), module, self.phase, op, event)
        self.storages.append(rec)
        self.live[key] = rec
        died = self.died
        rec.death = compat.on_storage_death(st, lambda: died.append(rec))
        return rec

    def lookup(self, t, create=True):
        """The live _Storage of tensor t (registering it as pre-existing if unseen)."""
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return None
        if self.fake and not compat.is_fake(t):
            # a real tensor under fake execution: a constant (torch.tensor(...)) about to be lifted into the
            # fake world by lift_fresh, which then counts it as created outside dispatch (see dispatch)
            return None
        st = compat.storage_of(t)
        key = st._cdata  # compat.storage_key
        rec = self.live.get(key)
        if rec is not None and (self._alive(rec)):
            return rec
        if rec is not None:  # the StorageImpl address was reused
            self._free(rec)
        if not create:
            return None
        rec = self._new_storage(t, st, "", None, None)
        if self.phase == "setup":
            rec.preexisting = True
        else:
            # created by code the dispatcher does not see (torch.tensor(...), from_numpy, a
            # C++ kernel's side output): count it as allocated where it is first seen
            rec.module = self.module_path()
            rec.op = "(created outside dispatch)"
            self.unseen.append(rec)
        return rec

    def _alive(self, rec):
        """Whether a live record's storage is still alive. Where deaths are reported (torch 2.x), a storage that
        died has its record in self.died until the next sweep: with none pending, every record in self.live is
        alive, and the weak reference (a Python-level call) need not be asked."""
        if self.track_deaths and not self.died:
            return True
        return not rec.ref.expired()

    def _free(self, rec):
        del self.live[rec.key]
        # a dead storage's weak references are dropped: each export keeps a record of every storage it saw, and
        # the collector visits whatever a record holds (issue 15: objects it keeps make its full passes longer)
        rec.ref = rec.death = None
        rec.freed_event = len(self.events) - 1
        if self.events:
            self.events[-1]["free"].append(rec.sid)

    def sweep(self):
        if not compat.DEATH_CALLBACKS:
            dead = compat.dead_storages(self.live.values())
        elif not self.died:
            return
        else:
            # a record whose key was taken over by a newer one was freed when the newer one was registered
            dead = sorted((r for r in self.died if self.live.get(r.key) is r), key=lambda r: r.sid)
            self.died.clear()
        for r in dead:
            self._free(r)

    # ---- phases, modules ----
    def set_phase(self, phase, step):
        self.sweep()
        self.phase = phase
        self.step = step
        self.bwd_module = ""
        self.stack = []  # a module forward an exception left (see compat.register_global_post_hook)

    def module_path(self):
        if self.stack:
            return self.stack[-1]
        if self.phase == "backward":
            return self.bwd_module
        if self.loss_region:
            return "(loss)"
        return ""

    def _pre_hook(self, module, args):
        name = self.names.get(id(module))
        if name is None:
            name = "(loss)" if self.loss_region else type(module).__name__
        self.stack.append(name)

    def _post_hook(self, module, args, out):
        if self.stack:
            self.stack.pop()

    def pack(self, t):
        rec = self.lookup(t)
        if self.unseen and self.events:
            self.events[-1]["alloc"].extend(r.sid for r in self.unseen)
            self.unseen = []
        module = self.module_path()
        if rec is not None:
            rec.saved = True
            if self.events:
                ev = self.events[-1]
                if rec.sid not in ev["saved"]:
                    ev["saved"].append(rec.sid)
        return _Packed(t, module)

    def unpack(self, p):
        if self.phase == "backward" and p.module:
            self.bwd_module = p.module
        if p.version is not None and p.t._version != p.version:
            raise ExportError(_MODIFIED % (p.module or "<root>", p.t._version, p.version))
        return p.t

    # another saved_tensors_hooks pair (activation checkpointing's) replaces ours while it is entered: its
    # hooks are wrapped so that module attribution in backward still works, and a tensor it packs during
    # backward (checkpointing's recompute, keeping the block's saved tensors until its backward consumes them)
    # is marked saved; in forward, checkpointing packs a placeholder and keeps nothing
    def foreign_pack(self, x, fn):
        module = self.module_path()
        if self.phase == "backward":
            self.pack(x)
        return _Packed(fn(x), module)

    def foreign_unpack(self, p, fn):
        if not isinstance(p, _Packed):  # packed before the recorder was installed
            return fn(p)
        if self.phase == "backward" and p.module:
            self.bwd_module = p.module
        return fn(p.t)

    def _wrap_hooks(self):
        cls = torch.autograd.graph.saved_tensors_hooks
        orig = cls.__enter__
        rec = self

        def enter(hooks):
            pack, unpack = hooks.pack_hook, hooks.unpack_hook
            if pack == rec.pack:
                return orig(hooks)
            hooks.pack_hook = _HookProxy(pack, lambda x: rec.foreign_pack(x, pack))
            hooks.unpack_hook = _HookProxy(unpack, lambda p: rec.foreign_unpack(p, unpack))
            try:
                return orig(hooks)
            finally:  # the pushed pair is the proxies; the object keeps its own hooks (its __exit__ reads them)
                hooks.pack_hook, hooks.unpack_hook = pack, unpack

        cls.__enter__ = enter
        return lambda: setattr(cls, "__enter__", orig)

    # ---- dispatch ----
    def hook_backward(self, root):
        """Hooks every autograd node reachable from `root` (a loss's grad_fn) so that the dispatches between one
        node's end and the next one's start are known as the engine's (self.engine_gap); returns the handles,
        to remove after backward. Only the engine sums gradients there (InputBuffer::add)."""
        handles, seen, todo = [], set(), [root]
        if not _TORCH2:  # no node pre-hooks before 2.0, and 1.x sums out of place anyway (_steals)
            return handles
        while todo:
            n = todo.pop()
            if n is None or n in seen:
                continue
            seen.add(n)
            handles.append(n.register_prehook(self._node_starts))
            handles.append(n.register_hook(self._node_ends))
            todo.extend(f for f, _ in n.next_functions)
        self.engine_gap = True  # the engine seeds the root's gradient before any node runs
        return handles

    def _node_starts(self, grad_outputs):
        self.engine_gap = False

    def _node_ends(self, grad_inputs, grad_outputs):
        self.engine_gap = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.engine_gap and func is _ADD and self.phase == "backward" and _steals(args, kwargs):
            func = _ADD_  # what the engine runs without a dispatch mode (_steals)
        op = _OPS.get(func)
        if op is None:
            op = _OPS[func] = _Op(func)
        if op.passthrough or not self.recording:
            return func(*args, **(kwargs or {}))
        if self.died or not self.track_deaths:
            self.sweep()
        module = self.module_path()
        in_tensors = _tensors(args, [])
        if kwargs:
            in_tensors = _tensors(kwargs.values(), []) + in_tensors
        else:
            kwargs = {}
        in_sids = []
        lookup = self.lookup
        for a in in_tensors:
            r = lookup(a)
            if r is not None and r.sid not in in_sids:
                in_sids.append(r.sid)
        c = self.counters
        if c is not None:
            live0 = c.aligned_live()
            c.reset_peak()
        if not _TORCH2:
            args = _scalar_tensor_args(func, args)
        fake = self.fake
        try:
            if fake and op.local_scalar and _ANSWERS:
                out = _ANSWERS.pop(0)  # what the real step reads here (answered_reads)
            else:
                out = func(*args, **kwargs)
        except ExportError:
            raise
        except Exception as e:
            raise ExportError(_op_failure(func, module, self.phase, self.device, e, fake)) from e
        if fake and op.real_sized:
            out = _real_sized_outputs(func, args, kwargs, out)
        lifted = None
        if fake and op.lift and in_tensors and not compat.is_fake(in_tensors[0]) \
                and isinstance(out, torch.Tensor):
            # torch.tensor(...) under fake execution: the real constant is lifted into a new fake tensor.
            # Executed for real, lift_fresh returns its input, a storage made outside dispatch that is counted
            # as allocated at this op; record the fake output the same way, so both traces are identical.
            lifted = self.lookup(out)
            in_sids = [lifted.sid]
        if op.returns_tensor and isinstance(out, (float, int, bool)):
            # torch 1.13: an op on a wrapped number (a 0-dim CPU double made from a Python scalar)
            # comes back as a Python scalar under a dispatch mode; give autograd the tensor it expects
            src = next((a for a in compat.flatten(args) if isinstance(a, torch.Tensor)), None)
            out = torch.tensor(out, dtype=src.dtype if src is not None else None)
        try:
            fl = flops.op_flops(func, args, kwargs, out)
        except Exception as e:
            raise ExportError("memplan_torch: counting the FLOPs of %s in module %r (phase %s) failed: %s"
                              % (op.name, module or "<root>", self.phase, e)) from e
        self._record(op.name, module, in_sids, in_tensors, out, lifted, c, live0 if c is not None else 0, fl)
        return out

    def _record(self, name, module, in_sids, in_tensors, out, lifted, c, live0, fl=0):
        """Appends the event of an op that returned `out`: the storages its outputs allocate or alias."""
        events = self.events
        outputs, alloc = [], []
        ev = {"op": name, "phase": self.phase, "module": module, "step": self.step,
              "alloc": alloc, "free": [], "saved": [], "outputs": outputs, "inputs": in_sids}
        if fl:
            ev["flops"] = fl
        if events:
            _seal(events[-1])
        events.append(ev)
        index = len(events) - 1
        if self.unseen:
            for r in self.unseen:
                r.event = index
                alloc.append(r.sid)
            self.unseen = []
        live = self.live
        strided = torch.strided
        dtype_name = compat.dtype_name
        for t in (out,) if isinstance(out, torch.Tensor) else _tensors((out,), []):
            if t.layout != strided:
                continue
            st = t.untyped_storage() if _TORCH2 else compat.storage_of(t)
            rec = live.get(st._cdata)
            if rec is not None and not self._alive(rec):
                self._free(rec)
                rec = None
            if lifted is not None and rec is lifted:
                outputs.append({"storage": rec.sid, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                                "alias": True, "inplace": True})
                continue
            alias = rec is not None
            if rec is None:
                rec = self._new_storage(t, st, module, name, index)
                alloc.append(rec.sid)
            inplace = False
            if alias:
                for a in in_tensors:
                    if t is a:
                        inplace = True
                        break
            outputs.append({"storage": rec.sid, "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                            "alias": alias, "inplace": inplace})
        if c is not None:
            new = sum(self.storages[o["storage"]].nbytes for o in outputs if not o["alias"])
            ev["scratch"] = max(0, c.aligned_peak() - live0 - new)

    def _refuse_autocast(self):
        """On meta: entering torch.autocast for another device during the step raises ExportError (checked on
        entry: inside __torch_dispatch__ autocast always reads as off)."""
        cls = torch.autocast
        orig = cls.__enter__
        rec = self

        def enter(ac):
            if rec.phase in PHASES and getattr(ac, "_enabled", True) and str(getattr(ac, "device", "")) != "meta":
                module = rec.module_path()
                raise ExportError(_META_AUTOCAST % (str(getattr(ac, "device", "?")),
                                                    "module %r" % module if module else "the root module",
                                                    rec.phase))
            return orig(ac)

        cls.__enter__ = enter
        return lambda: setattr(cls, "__enter__", orig)

    # ---- context ----
    def install(self, model):
        self.names = {id(m): n for n, m in model.named_modules()}
        self._unwrap = self._wrap_hooks()
        self._unwrap_autocast = self._refuse_autocast() if self.meta else None
        if compat.global_module_hooks_available():
            self._h = [module_mod.register_module_forward_pre_hook(self._pre_hook),
                       compat.register_global_post_hook(self._post_hook)]
        else:  # pragma: no cover - very old torch
            self._h = []
            for m in model.modules():
                self._h.append(m.register_forward_pre_hook(self._pre_hook))
                self._h.append(m.register_forward_hook(self._post_hook))

    def uninstall(self):
        for attr in ("_unwrap", "_unwrap_autocast"):
            unwrap = getattr(self, attr, None)
            if unwrap is not None:
                unwrap()
                setattr(self, attr, None)
        for h in self._h:
            h.remove()
        self._h = []


_REAL_SIZES = {}  # (op, argument signature) -> the real output sizes


def _signature(x):
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(y) for y in x)
    return x


def _real_sized_outputs(func, args, kwargs, out):
    """`out` (a tuple of fake tensors) with the real kernel's output sizes, strides and storage sharing: the op
    runs once for real on zero tensors of the arguments' shapes, dtypes and strides (outside every dispatch mode;
    not under no_grad, where oneDNN's LSTM makes no workspace), and a fake output whose size or strides differ,
    or that shares its storage with an earlier output where the real one does not, is replaced by a new fake
    tensor."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    key = (str(func), _signature((args, sorted(kwargs.items()))))
    real_outs = _REAL_SIZES.get(key)
    if real_outs is None:
        def real(x):
            if isinstance(x, torch.Tensor):
                return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype).zero_()
            if isinstance(x, (list, tuple)):
                return type(x)(real(y) for y in x)
            return x
        with unset_fake_temporarily():
            r = func(*real(args), **{k: real(v) for k, v in kwargs.items()})
        real_outs = []
        for t in r:
            if not isinstance(t, torch.Tensor):
                real_outs.append(None)
                continue
            k = compat.storage_key(compat.storage_of(t))
            first = next((j for j, o in enumerate(real_outs) if o is not None and o[3] == k), None)
            real_outs.append((tuple(t.shape), tuple(t.stride()), t.dtype, k, first))
        real_outs = [None if o is None else o[:3] + (o[4],) for o in real_outs]
        del r
        _REAL_SIZES[key] = real_outs
    out = list(out)
    keys = []
    for i, (t, ro) in enumerate(zip(out, real_outs)):
        if ro is None or not isinstance(t, torch.Tensor):
            keys.append(None)
            continue
        shape, stride, dtype, shares = ro
        k = compat.storage_key(compat.storage_of(t))
        if tuple(t.shape) != shape or tuple(t.stride()) != stride or (shares is None and k in keys):
            t = out[i] = torch.empty_strided(shape, stride, dtype=dtype, device=t.device)
            k = compat.storage_key(compat.storage_of(t))
        keys.append(k)
    return tuple(out)


_WRAPPED_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64}
_TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def _scalar_tensor_args(func, args):
    """torch 1.13 hands a wrapped number (the 0-dim tensor autograd makes of a Python scalar, e.g. the 0.5 of
    `x * 0.5`) to a dispatch mode as a Python scalar. An op that takes it as a Tensor then fails: non-reentrant
    checkpointing detaches every tensor autograd saves while it recomputes a block in backward, wrapped numbers
    included (`aten.detach.default ... found type 'float'`). Give such an argument back its 0-dim tensor, with
    the dtype PyTorch gives wrapped numbers; it is smaller than any tracked allocation. PyTorch 2.x takes the
    scalar back where the schema says Tensor; there this does nothing (under fake execution each torch.tensor()
    here would cost a fake-tensor conversion, about 5 ms: 20% of a transformer's fake export)."""
    if _TORCH2 or not any(type(a) in _WRAPPED_DTYPE for a in args):
        return args
    try:
        schema = func._schema.arguments
    except AttributeError:  # pragma: no cover
        return args
    out = list(args)
    for i, (a, sa) in enumerate(zip(args, schema)):
        if type(a) in _WRAPPED_DTYPE and str(sa.type) == "Tensor":
            out[i] = torch.tensor(a, dtype=_WRAPPED_DTYPE[type(a)])
    return tuple(out)


def _returns_tensor(func):
    try:
        rets = func._schema.returns
        return len(rets) == 1 and str(rets[0].type) == "Tensor"
    except AttributeError:  # pragma: no cover
        return False


# What the meta device traces differently from cpu (issue 10, item 6): refused with ExportError, so that
# --device auto falls back to cpu. (Tied parameters are kept tied by harness.to_device.)
_META_AUTOCAST = ("memplan_torch: torch.autocast(%r) is entered in %s during %s; the meta device does not apply "
                  "it (autocast casts only tensors of its own device: the float32 program would be recorded); "
                  "trace with --fake (PyTorch 2.x) or --device cpu")
_META_RNN = ("memplan_torch: module %r is a %s, which runs oneDNN's fused kernel on cpu but a per-time-step "
             "decomposition on the meta device (other ops, other temporaries, another peak); trace with --fake "
             "(PyTorch 2.x) or --device cpu")


def check_meta(model):
    """Raises ExportError for a model the meta device would trace as another program than cpu runs."""
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.RNNBase):
            raise ExportError(_META_RNN % (name or "<root>", type(m).__name__))


def _op_failure(func, module, phase, device, e, fake=False):
    where = "module %r" % module if module else "outside any module"
    first = str(e).splitlines()[0] if str(e) else ""
    if fake:
        why = {"DataDependentOutputException": "it reads tensor values (item(), bool(tensor), nonzero ...), "
                                               "which fake tensors do not have",
               "DynamicOutputShapeException": "its output shape depends on tensor values",
               "UnsupportedOperatorException": "it has no fake (meta) implementation in this PyTorch"}.get(
            type(e).__name__, "%s: %s" % (type(e).__name__, first[:300]))
        if "no fake impl" in str(e) or "no fake implementation" in str(e):
            why = ("it has no fake implementation (a custom op: register one with torch.library.register_fake, "
                   "which computes only its output's shape)")
        elif "convert all Tensors to FakeTensors" in str(e) or "allow_non_fake_inputs" in str(e):
            if module == "(loss)":
                why = ("the loss function reads a tensor that is not among the inputs or targets (captured by a "
                       "closure?), which stays real: pass it as targets=, or use the builder form "
                       "MODULE:FUNCTION(batch_size) returning (model, inputs, loss_fn, targets)")
            else:
                why = ("it reads a real tensor that is not a parameter, buffer, input or target (a plain tensor "
                       "attribute: register it with register_buffer)")
        where = "module %r" % module if module else "the root module (or outside any module)"
        msg = "memplan_torch: op %s failed under fake tensors in %s during %s: %s" % (func, where, phase,
                                                                                    why.rstrip("."))
        if "builder form" in why:  # run for real, the closure fails at the second fit point instead
            return msg
        return msg + "; or export with --real --device cpu (fake=False, device='cpu') to run the step for real"

    msg = "memplan_torch: op %s failed on device %s in %s during %s: %s: %s." % (
        func, device, where, phase, type(e).__name__, first)
    name = str(func)
    data_dep = any(s in name for s in ("_local_scalar_dense", "is_nonzero", "nonzero", "item", "equal",
                                       "unique", "masked_select"))
    if device == "meta":
        if data_dep:
            msg += (" The model reads tensor values (item(), bool(tensor), nonzero ...), which the meta device "
                    "does not have. Export with device='cpu' (--device cpu) at a small batch, or make the "
                    "control flow independent of tensor values.")
        else:
            msg += (" The op has no meta kernel in this PyTorch; export with device='cpu' (--device cpu) at a "
                    "small batch.")
    else:
        msg += " Check that the model and its inputs run a training step outside memplan_torch."
    return msg


def _categorize(rec, params, buffers, grads, states, inputs):
    if rec.sid in params:
        return "parameter"
    if rec.sid in buffers:
        return "parameter"
    if rec.sid in grads:
        return "gradient"
    if rec.sid in states:
        return "optimizer_state"
    if rec.sid in inputs:
        return "input"
    if rec.saved:
        return "activation"
    if rec.preexisting:
        return "input"
    return "temporary"


def _output_sids(rec, out):
    """Storage ids of the tensors in a model's output (a tensor, tuples, lists, dicts: a transformers ModelOutput
    is an OrderedDict), in order, each once."""
    ids = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            r = rec.lookup(o, create=False)
            if r is not None and r.sid not in ids:
                ids.append(r.sid)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)
    walk(out)
    return ids


def state_sids(rec, opt):
    """Storage ids of the tensors the optimizer holds in its state now."""
    out = set()
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                r = rec.lookup(v, create=False)
                if r is not None:
                    out.add(r.sid)
    return out


def trace_once(job, optimizer="adamw", device="meta", foreach=None, fake_mode=None, prime=None):
    """Runs two training steps of `job` on `device` under the recorder; with `fake_mode` (a FakeTensorMode
    the job's tensors belong to), under that mode, without computing.

    prime (a list of parameter indices): the first step is only an optimizer step, on gradients made before it
    for these parameters (those another trace of the same model found with gradients), which creates the
    optimizer's state as a whole first step does without its forward and backward. The second step, the
    steady one, is then the same; the first step's forward and backward events are absent (the exporter uses
    such traces only for sizes at other fit points). With fake tensors the gradients cost nothing.

    Returns a raw trace dict (see export.py for the written form). The step runs with Python's collector as the
    caller had it, even inside an export's pause (memplan_torch.collector)."""
    with collector.as_before():
        return _trace_once(job, optimizer, device, foreach, fake_mode, prime)


def _trace_once(job, optimizer, device, foreach, fake_mode, prime):
    model = job.model
    model.train()
    if str(device) == "meta":
        check_meta(model)
    rec = Recorder(device, fake=fake_mode is not None)
    opt = harness.make_optimizer(optimizer, model.parameters(), foreach=foreach)
    params = [p for p in model.parameters()]
    buffers = [b for b in model.buffers()]

    grad_sids = set()
    with_grad = []
    param_grads = []  # (parameter's storage, its .grad's storage) as the steady step's optimizer phase starts

    def optimizer_step(n):
        rec.set_phase("optimizer", n)
        for i, p in enumerate(params):
            if p.grad is not None:
                if n == 1:
                    with_grad.append(i)
                r = rec.lookup(p.grad, create=False)
                if r is not None:
                    grad_sids.add(r.sid)
                    q = rec.lookup(p, create=False)
                    if n == 2 and q is not None:
                        param_grads.append((q.sid, r.sid))
        opt.step()
        compat.zero_grad(opt)
        rec.sweep()

    def prime_step():
        rec.set_phase("setup", 1)
        rec.recording = False
        try:
            with torch.no_grad():
                for i in prime:
                    params[i].grad = torch.empty_like(params[i])
        finally:
            rec.recording = True
        for i in prime:
            rec.lookup(params[i].grad)  # pre-existing, as inputs are: not allocated by an op of the step
        optimizer_step(1)

    model_output = {}  # step -> (index of the model's last forward event, storage ids of its output tensors)

    def step(n):
        rec.set_phase("forward", n)
        with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
            out = job.forward()
            model_output[n] = (len(rec.events) - 1, _output_sids(rec, out))
            rec.loss_region = True
            try:
                loss = job.loss(out)
            finally:
                rec.loss_region = False
            del out
            rec.set_phase("backward", n)
            hooks = rec.hook_backward(loss.grad_fn)
            try:
                loss.backward()
            finally:
                rec.engine_gap = False
                for h in hooks:
                    h.remove()
        del loss
        optimizer_step(n)

    rec.install(model)
    marks = {}
    outer = fake_mode if fake_mode is not None else contextlib.nullcontext()
    try:
        with outer, rec:
            # register what exists before the first step, so it is not mistaken for an op output
            for t in params + buffers + job.tensors():
                rec.lookup(t)
            marks["step1"] = len(rec.events)
            if prime is None:
                step(1)
            else:
                prime_step()
            marks["step2"] = len(rec.events)
            rec.sweep()
            initial = [r.sid for r in sorted(rec.live.values(), key=lambda r: r.sid)]
            # the optimizer's state as the steady step starts (ids only: a reference kept here would keep a
            # state tensor that the step replaces alive)
            states_before = state_sids(rec, opt)
            marks["step2_ops"] = len(rec.events)
            step(2)
            marks["end"] = len(rec.events)
            rec.sweep()
            end_live = [r.sid for r in sorted(rec.live.values(), key=lambda r: r.sid)]
    finally:
        rec.uninstall()

    def sids(ts):
        out = set()
        for t in ts:
            r = rec.lookup(t, create=False)
            if r is not None:
                out.add(r.sid)
        return out

    p_sids = sids(params)
    b_sids = sids(buffers)
    i_sids = sids(job.tensors())
    # the state after the steady step, and before it: an optimizer that replaces its state tensors each step
    # (m = b*m + g stored back) holds other storages at the two points; both are its state (the initial ones
    # are what the first step creates)
    s_sids = state_sids(rec, opt) | states_before
    buf_set = b_sids
    g_sids = grad_sids
    return {"recorder": rec, "marks": marks, "model_output": model_output.get(2), "with_grad": with_grad, "primed": prime is not None, "scratch_measured": rec.counters is not None, "initial": initial, "end_live": end_live,
            "params": p_sids, "buffers": buf_set, "inputs": i_sids, "states": s_sids,
            "grads": g_sids, "param_grads": param_grads, "n_params": sum(p.numel() for p in params),
            "param_bytes": sum(p.numel() * p.element_size() for p in params)}
