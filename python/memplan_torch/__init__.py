"""memplan_torch: the PyTorch side of memplan.

* export(): trace one steady-state training step at the aten-op level into a memplan.trace/v1 file;
* measure(): run pinned workloads for real and record per-phase peaks (memplan.measured/v1);
* check_alignment(): compare k accumulated micro-steps with the full batch;
* suite: the validation suite (python3 -m memplan_torch suite --out DIR).

Formats: docs/trace-format.md and docs/measure-format.md in the memplan repository.
"""

__version__ = "0.1.0"

import sys as _sys

try:
    from .align import check_alignment, check_workload  # noqa: E402,F401
    from .export import export, export_builder  # noqa: E402,F401
    from .measure import MeasureError, measure  # noqa: E402,F401
    from .trace import ExportError  # noqa: E402,F401
    from .workload import WorkloadError  # noqa: E402,F401
    from .workload import load as load_workload  # noqa: E402,F401
except (KeyboardInterrupt, RuntimeError) as _err:
    # Ctrl-C while `python3 -m memplan_torch` still imports torch: runpy imports this package before __main__, with
    # sys.argv[0] "-m" until it has found the module; the command answers it as main() does (issue 15 item 8).
    # Imported by a program of its own, the interrupt is the program's.
    from .atomic import exit_interrupted, is_interrupt
    if _sys.argv[:1] != ["-m"] or not is_interrupt(_err):
        raise
    raise SystemExit(exit_interrupted())
