import os
import subprocess
import sys
import textwrap

from memplan_torch import tracker

SCRIPT = textwrap.dedent("""
    import ctypes, sys, torch
    sys.path.insert(0, %r)
    from memplan_torch import tracker
    c = tracker.counters()
    assert c is not None, "tracker not active"
    print("threshold", c.threshold())
    torch.empty(1 << 20, dtype=torch.float32)  # warm up (first-call caches)
    live0, al0 = c.live(), c.aligned_live()
    x = torch.empty(1 << 20, dtype=torch.float32)
    print("alloc", c.live() - live0, c.aligned_live() - al0)
    c.reset_peak()
    del x
    print("freed", c.live() - live0, c.aligned_live() - al0)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.realloc.restype = ctypes.c_void_p
    libc.calloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    l0 = c.live()
    p = libc.malloc(100000)
    a = c.live() - l0
    p = libc.realloc(ctypes.c_void_p(p), 300000)
    b = c.live() - l0
    q = libc.calloc(10, 5000)
    d = c.live() - l0
    small = libc.malloc(100)
    e = c.live() - l0
    libc.free(ctypes.c_void_p(small)); libc.free(ctypes.c_void_p(q)); libc.free(ctypes.c_void_p(p))
    print("libc", a, b, d, e, c.live() - l0)
    print("peak_after_reset", c.peak() - live0)
    print("overflow", c.overflow())
""")


def run_under_tracker(code, threshold=1024):
    env = tracker.preload_env(threshold)
    r = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = r.stdout.decode()
    assert r.returncode == 0, out
    return dict((line.split(" ", 1)[0], line.split(" ", 1)[1]) for line in out.strip().splitlines())


def test_build_is_cached():
    p = tracker.build()
    assert os.path.exists(p)
    assert tracker.build() == p


def test_counts_known_allocation_exactly():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = run_under_tracker(SCRIPT % root)
    assert res["threshold"] == "1024"
    assert res["alloc"] == "%d %d" % (4 << 20, 4 << 20)  # torch.empty(1<<20, float32): +4 MiB
    assert res["freed"] == "0 0"
    assert res["libc"] == "100000 300000 350000 350000 0"  # malloc, realloc, calloc; 100 B is under threshold
    assert res["peak_after_reset"] == str(4 << 20)
    assert res["overflow"] == "0"


def test_not_active_without_preload():
    assert tracker.counters() is None
