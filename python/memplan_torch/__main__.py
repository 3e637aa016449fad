"""python3 -m memplan_torch {export,export-hf,measure,align,suite,build-tracker}"""

import argparse
import json
import os
import re
import sys


def _reexec_under_tracker(threshold):
    """Re-executes this command under the LD_PRELOAD tracker (CPU measurement)."""
    from . import tracker
    if tracker.counters() is not None:
        return
    if os.environ.get("MEMPLAN_TRACKER_CHILD"):
        raise SystemExit("memplan_torch: the tracker was preloaded but is not active (LD_PRELOAD=%s)"
                         % os.environ.get("LD_PRELOAD"))
    env = tracker.preload_env(threshold)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    pp = [root] + [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(pp)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "memplan_torch"] + sys.argv[1:], env)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 1, as every memplan error (subcommands inherit it)."""

    def error(self, message):
        # an argument quoted in the message may hold a line break: written as \n, so the error stays one line
        message = message.replace("\n", "\\n").replace("\r", "\\r")
        self.exit(1, "error: %s: %s (see %s --help)\n" % (self.prog, message, self.prog))


# memplan's bound on the tokens of one micro-step (engine/limits.go MaxTokens, 2^34: their int64 ids alone are
# 128 GiB): a larger --batch or --seq-len is refused before torch runs (--batch 10^30 gave torch's C++ backtrace).
MAX_TOKENS = 1 << 34

# ASCII decimal digits with an optional sign, as memplan's flags take them (strconv base 10): int() also takes
# 1_0, Arabic-Indic and full-width digits and surrounding spaces, which memplan refuses.
_DECIMAL = re.compile(r"[+-]?[0-9]+\Z")


def _whole(least, most=None):
    """An argparse type: a whole number of at least `least` (so --batch 0 is refused in one line) and at most
    `most`."""
    def parse(s):
        if not _DECIMAL.match(s):
            raise argparse.ArgumentTypeError("want a whole number, got %s" % _quote_arg(s))
        v = int(s)
        if v < least:
            raise argparse.ArgumentTypeError("must be at least %d, got %d" % (least, v))
        if most is not None and v > most:
            raise argparse.ArgumentTypeError("must be at most %d (2^34 tokens per micro-step, memplan's limit), "
                                             "got %s" % (most, s if len(s) <= 40 else s[:40] + "..."))
        return v
    parse.__name__ = "whole number"
    return parse


def _quote_arg(s):
    """s quoted on one line (repr escapes line breaks), cut to 60 characters."""
    return repr(s if len(s) <= 60 else s[:60] + "...")


def main(argv=None):
    p = _Parser(prog="python3 -m memplan_torch",
                description="memplan's PyTorch side: traces, measurements, alignment.")
    sub = p.add_subparsers(dest="cmd", required=True)

    e = sub.add_parser("export", help="trace a training step into a memplan.trace/v1 JSON file")
    e.add_argument("builder", help="MODULE:FUNCTION; FUNCTION(batch_size[, seq_len=]) returns "
                                   "(model, inputs, loss_fn[, targets])")
    e.add_argument("--out", required=True, help="the trace file to write (a symbolic link is written through; its "
                                                "directory must exist)")
    e.add_argument("--batch", type=_whole(1, MAX_TOKENS), default=2,
                   help="batch of the trace (sizes are fitted from traces at it and twice it; at 2 and 4 for 1, "
                        "whose size-1 fast paths differ, and evaluated at 1)")
    e.add_argument("--seq-len", type=_whole(1, MAX_TOKENS), default=None, help="passed to the builder as seq_len=")
    e.add_argument("--seq-dim", type=_whole(0), default=None,
                   help="the inputs' sequence dimension: fit sizes in the sequence too (needs --seq-len; never "
                        "traced at a length of 1; an index past the inputs' rank is refused)")
    e.add_argument("--batch-dim", type=_whole(0), default=0,
                   help="the inputs' batch dimension (default 0; an index past the inputs' rank is refused)")
    e.add_argument("--optimizer", default="adamw", help="adamw | sgd | sgd-momentum")
    e.add_argument("--device", default="auto", choices=["auto", "meta", "cpu"],
                   help="auto: meta, falling back to cpu when an op fails on meta")
    e.add_argument("--foreach", default=None, choices=["true", "false"])
    x = e.add_mutually_exclusive_group()
    x.add_argument("--fake", dest="fake", action="store_true", default=False,
                   help="PyTorch 2.x: run the step on fake cpu tensors (FakeTensorMode): no compute, no memory; "
                        "the same trace as --device cpu, without in-kernel scratch")
    x.add_argument("--real", dest="fake", action="store_false",
                   help="run the step for real on --device (the default)")

    h = sub.add_parser("export-hf", help="trace a transformers model built from its config (random weights, fake "
                                         "tensors, PyTorch 2.x) through one Trainer step")
    h.add_argument("model", help="a transformers config.json, or the name of a config memplan ships (memplan "
                                 "models: llama-3-8b, ...; or its Hugging Face id); nothing is downloaded")
    h.add_argument("--seq", type=int, default=None, help="sequence length in tokens (not for ViT)")
    h.add_argument("--batch", type=int, default=2, help="trace batch size (a second trace runs at twice it)")
    h.add_argument("--precision", default="amp-bf16",
                   help="as memplan plan --precision (default amp-bf16): fp32; amp-bf16/amp-fp16 = autocast over "
                        "fp32 parameters (Trainer --bf16/--fp16); pure-bf16/pure-fp16 = the model in 16 bits")
    h.add_argument("--gradient-checkpointing", nargs="?", const="non-reentrant", default=None,
                   metavar="non-reentrant|reentrant",
                   help="gradient_checkpointing_enable() as Trainer calls it (use_reentrant=False, transformers' "
                        "default, unless 'reentrant')")
    h.add_argument("--lora", default=None, metavar="SPEC",
                   help="peft LoRA adapters, as memplan plan --lora: r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj")
    h.add_argument("--peft", default=None, choices=["lora"], help="--peft lora: LoRA with peft's defaults "
                                                                  "(or --lora SPEC)")
    h.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config.json field (value parsed as JSON); repeatable. Size fields must be "
                        "whole numbers of at least 1 and at most: layers 256, attention heads 1024, widths "
                        "(hidden, intermediate, head_dim) 262144, vocab_size 1048576, positions 16777216, image "
                        "sizes 65536, experts per token the experts; and layers x (1 + experts) at most 32768 "
                        "blocks, as memplan plan bounds them (memplan_torch.hf.SIZE_BOUNDS)")
    h.add_argument("--out", default="trace.json", help="the trace file to write (its directory must exist)")
    h.add_argument("--foreach", default="true", choices=["true", "false"],
                   help="AdamW's foreach implementation (default true: what torch picks for cuda parameters)")
    h.add_argument("--no-seq-fit", dest="fit_seq", action="store_false",
                   help="fit sizes in the batch only (two traces instead of six)")
    h.add_argument("--real", action="store_true",
                   help="build the model and run the step for real on cpu (the fallback when an op cannot run "
                        "under fake tensors; slower, and it needs the model's memory)")

    m = sub.add_parser("measure", help="run workloads for real; write memplan.measured/v1")
    m.add_argument("workloads", nargs="+", help="workload files (YAML or JSON)")
    m.add_argument("--out", required=True, help="the file to write (its directory must exist)")
    m.add_argument("--threshold", type=int, default=1024, help="CPU tracker: smallest counted allocation")

    a = sub.add_parser("align", help="check k accumulated micro-steps against the full batch")
    a.add_argument("workload")
    a.add_argument("--k", type=int, default=None, help="accumulation (default: strategy.accumulation)")
    a.add_argument("--tolerance", type=float, default=None)
    a.add_argument("--json", action="store_true")

    s = sub.add_parser("suite", help="run the validation suite")
    s.add_argument("--out", required=True, help="the folder to write into (made if missing; the folder above it "
                                                "must exist)")
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    s.add_argument("--cases", default=None, help="comma-separated case names")
    s.add_argument("--iters", type=int, default=2)
    s.add_argument("--threshold", type=int, default=1024)

    sub.add_parser("build-tracker", help="compile the CPU tracker (csrc/memtrack.c) into the cache")

    args = p.parse_args(argv)
    if args.cmd == "export" and args.seq_len is not None and args.batch * args.seq_len > MAX_TOKENS:
        p.exit(1, "error: %s export: --batch %d x --seq-len %d is over memplan's limit of 2^34 tokens per "
                  "micro-step\n" % (p.prog, args.batch, args.seq_len))
    from .atomic import Interrupted, exit_interrupted, is_interrupt, one_line
    try:
        _check_outputs(args)
        return _run(args)
    except Interrupted as err:
        print("error: memplan_torch: interrupted by signal %d while writing; nothing was written" % err.signum,
              file=sys.stderr)
        return 128 + err.signum
    except KeyboardInterrupt:
        return exit_interrupted()
    except Exception as err:  # one line, never a traceback (MEMPLAN_TORCH_TRACEBACK=1 shows it)
        if is_interrupt(err):  # torch 1.13 loading its C extension
            return exit_interrupted()
        if os.environ.get("MEMPLAN_TORCH_TRACEBACK"):
            raise
        print("error: %s" % one_line(err), file=sys.stderr)
        return 1


def _print_case(c):
    print("%s on %s: peak %d bytes in %s (forward %d, backward %d, optimizer %d), start %d, %.3fs/step"
          % (c["name"], c["device"], c["peak_bytes"], c["peak_phase"], c["phases"]["forward"],
             c["phases"]["backward"], c["phases"]["optimizer"], c["baseline_bytes"], c["step_time_s"]))
    sys.stdout.flush()


def _check_outputs(args):
    """Output paths are checked before any work: a directory, a named pipe or an unwritable directory given as
    --out is refused in one line (memplan_torch.atomic), and so is one whose directory does not exist (no
    folder is made for it; suite makes its --out folder, but not the folders above it)."""
    from .atomic import check_dir, check_out, OutputError
    if args.cmd in ("export", "export-hf", "measure"):
        check_out(args.out)
    elif args.cmd == "suite":
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise OutputError("memplan_torch: suite --out %s is not a directory" % args.out)
        if os.path.isdir(args.out):
            check_out(os.path.join(args.out, "measured.json"))
        else:  # suite makes its --out folder, not the folders above it
            check_dir(os.path.dirname(os.path.abspath(args.out)), args.out)


def _run(args):
    if args.cmd == "build-tracker":
        from . import tracker
        print(tracker.build(force=True, verbose=True))
        return 0
    if args.cmd == "export":
        from .export import export_builder
        doc = export_builder(args.builder, args.out, batch=args.batch, seq_len=args.seq_len,
                             optimizer=args.optimizer, batch_dim=args.batch_dim, seq_dim=args.seq_dim,
                             device=args.device, fake=args.fake,
                             foreach=None if args.foreach is None else args.foreach == "true")
        print("wrote %s: %d events, traced on %s%s%s" % (args.out, len(doc["events"]),
                                                         "fake " if doc["execution"] == "fake" else "",
                                                         doc["trace_device"],
                                                       "".join("\n  note: " + n for n in doc["notes"])))
        return 0
    if args.cmd == "export-hf":
        from .hf import export_hf, parse_lora
        lora = parse_lora(args.lora) if args.lora else parse_lora("") if args.peft == "lora" else None
        doc = export_hf(args.model, args.out, args.seq, batch=args.batch, precision=args.precision,
                        overrides=args.override, fit_seq=args.fit_seq, foreach=args.foreach == "true",
                        gradient_checkpointing=args.gradient_checkpointing, lora=lora, real=args.real)
        print("wrote %s: %d events, %d parameters, traced on %s%s%s" % (
            args.out, len(doc["events"]), doc["n_params"], "fake " if doc["execution"] == "fake" else "",
            doc["trace_device"],
            "".join("\n  note: " + n for n in doc["notes"])))
        return 0
    if args.cmd == "measure":
        from .workload import load
        from .measure import needs_tracker, measure_each, document
        from .export import write_json
        ws = [load(w) for w in args.workloads]
        if needs_tracker(ws):
            _reexec_under_tracker(args.threshold)
        cases, failed = measure_each(ws, args.workloads, _print_case)
        if cases:
            write_json(document(cases), args.out)
        if failed:
            for line in failed:
                print("error: %s" % line, file=sys.stderr)
            print("error: memplan_torch: measure: %d of %d cases failed; %s" % (
                len(failed), len(ws), "wrote the other %d to %s" % (len(cases), args.out) if cases else
                "nothing was written"), file=sys.stderr)
            return 1
        return 0
    if args.cmd == "align":
        from .workload import load
        from .align import check_workload, format_report
        rep = check_workload(load(args.workload), k=args.k, tolerance=args.tolerance)
        print(json.dumps(rep, indent=1) if args.json else format_report(rep))
        return 0 if rep["aligned"] else 1
    if args.cmd == "suite":
        from .measure import resolve_device
        if resolve_device(args.device) == "cpu":
            _reexec_under_tracker(args.threshold)
        from . import suite
        suite.run(args.out, device=args.device, iters=args.iters,
                  cases=args.cases.split(",") if args.cases else None)
        return 0
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before main's own answer is in place (argparse, its imports)
        from .atomic import exit_interrupted
        sys.exit(exit_interrupted())
