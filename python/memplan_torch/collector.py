"""Python's cyclic garbage collector during an export.

The exporter keeps hundreds of thousands of dicts and tuples of its own (every event of every trace at every fit
point, their alignments, the document), and CPython's collector makes a full pass over every tracked object each
time the old generation has grown by a quarter since the last one (Modules/gcmodule.c: long_lived_pending >
long_lived_total / 4). A 50-layer stack's export never gets there and a 400-layer one's made six full passes over
the whole heap, PyTorch's own 300,000 objects included: 2.9 of its 15 s (python/bench_export_scaling.py, where
CI measured 10.3x the time of 50 layers for 8x the ops; issue 15).

So an export does its bookkeeping with the collector paused and the objects that were alive before it frozen
(gc.freeze: left out of every pass until it ends), and runs each training step with the collector as the caller
had it (as_before), so that a storage kept alive by a reference cycle dies when a collection finds it, as in the
run. The bookkeeping makes no cycles and holds no tensors; the traced model, its inputs and optimizer are made
inside the export (export() traces copies), after the freeze, so every cycle the step can free is collected as
in the run; only garbage among the objects frozen (the caller's) waits for the export's end. The 400-layer
export's full passes: 0.6 s.
"""

import contextlib
import gc

_outer = []  # the collector's state before each paused(), innermost last


@contextlib.contextmanager
def paused():
    """The collector off and the heap before it frozen, restored on exit (nested: only the outermost freezes)."""
    was = gc.isenabled()
    outermost = not _outer
    _outer.append(was)
    if outermost:
        gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        _outer.pop()
        if outermost:
            gc.unfreeze()
        if was:
            gc.enable()


@contextlib.contextmanager
def as_before():
    """Inside paused(): the collector on if it was on before the outermost pause (around a training step)."""
    if not _outer or not _outer[0]:
        yield
        return
    gc.enable()
    try:
        yield
    finally:
        gc.disable()
