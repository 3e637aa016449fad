"""Build and read the CPU live-bytes tracker (csrc/memtrack.c).

The tracker is an LD_PRELOAD library: it must be loaded before Python starts so
that every allocation of the process goes through it.  ``build()`` compiles it
with the machine's C compiler into a cache directory; ``counters()`` returns a
reader when the current process runs under it; ``preload_env()`` gives the
environment with which to start (or re-exec) a process under it.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "memtrack.c")
DEFAULT_THRESHOLD = 1024


class TrackerError(RuntimeError):
    pass


def cache_dir():
    base = os.environ.get("MEMPLAN_CACHE_DIR")
    if not base:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "memplan_torch")
    return base


def library_path():
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return os.path.join(cache_dir(), "memtrack-%s.so" % digest)


def build(force=False, verbose=False):
    """Compiles memtrack.c (once per source version) and returns the .so path."""
    out = library_path()
    if os.path.exists(out) and not force:
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise TrackerError("memplan_torch: no C compiler found (install gcc: apt-get install -y gcc) "
                           "to build the CPU memory tracker")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = "%s.tmp.%d" % (out, os.getpid())
    cmd = [cc, "-O2", "-shared", "-fPIC", "-o", tmp, SOURCE, "-ldl"]
    if verbose:
        print(" ".join(cmd))
    # build without our own preload in the environment
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        raise TrackerError("memplan_torch: building the tracker failed:\n%s" % r.stdout.decode(errors="replace"))
    os.replace(tmp, out)
    return out


def preload_env(threshold=DEFAULT_THRESHOLD, env=None):
    """Environment that starts a process under the tracker."""
    lib = build()
    env = dict(os.environ if env is None else env)
    pre = env.get("LD_PRELOAD", "")
    if lib not in pre.split(":"):
        env["LD_PRELOAD"] = (lib + ":" + pre) if pre else lib
    env["MEMTRACK_THRESHOLD"] = str(int(threshold))
    # oneDNN keeps every primitive it creates (and its kernel-owned buffers) in process-wide caches
    # whose size depends on which kernels it picks for each shape; a trace at a small batch cannot see
    # what it would pick at a larger one. With the caches off, those buffers are allocated per call,
    # where the trace records them as the op's scratch. (LRU_CACHE_CAPACITY=0 crashes ideep in 1.13.)
    env.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
    env.setdefault("LRU_CACHE_CAPACITY", "1")
    # The CPU kernels PyTorch picks depend on the host: with AVX512-BF16 and AMX, oneDNN's bf16 matmuls and the
    # CPU flash attention pack their operands into buffers the tracker sees (measured on such a host:
    # torchtune-lora-bf16's forward 16.74 MB, the suite's vit_b16_small backward +0.4 MiB, both against 15.1 MB
    # and the prediction with the caps). Capping both at AVX2 measures the same kernels on every x86-64 host
    # (capping ATen alone fails: the flash kernel's pack_vnni2 then refuses to run).
    env.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    env.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    env["MEMPLAN_TRACKER_CHILD"] = "1"
    return env


class Counters:
    """Reads the tracker of the current process."""

    def __init__(self, lib):
        self._lib = lib
        for name in ("memtrack_live", "memtrack_peak", "memtrack_aligned_live", "memtrack_aligned_peak",
                     "memtrack_count", "memtrack_overflow", "memtrack_threshold"):
            getattr(lib, name).restype = ctypes.c_int64
        lib.memtrack_reset_peak.restype = None

    def live(self):
        return int(self._lib.memtrack_live())

    def peak(self):
        return int(self._lib.memtrack_peak())

    def aligned_live(self):
        return int(self._lib.memtrack_aligned_live())

    def aligned_peak(self):
        return int(self._lib.memtrack_aligned_peak())

    def reset_peak(self):
        self._lib.memtrack_reset_peak()

    def threshold(self):
        return int(self._lib.memtrack_threshold())

    def overflow(self):
        return int(self._lib.memtrack_overflow())

    def count(self):
        return int(self._lib.memtrack_count())


def counters():
    """Returns Counters when this process runs under the tracker, else None."""
    try:
        lib = ctypes.CDLL(None)
        fn = lib.memtrack_active
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    if not fn():
        return None
    return Counters(lib)
