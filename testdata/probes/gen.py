#!/usr/bin/env python3
"""Writes issue 15's adversarial probe corpus (testdata/probes/*.txt) that
cmd/memplan's TestProbes runs: every command × every flag × hostile values,
every file-taking flag or argument × bad files, and the issue's own
reproductions (repro.txt, written by hand, not by this script).

    python3 testdata/probes/gen.py        # rewrites flags.txt, files.txt and edges.txt

A line is `EXIT WANT ARGS...`, shell-quoted: EXIT is the exit status
(0, 1, 3, 4) or `serves` (still serving after the harness's grace period,
then stopped), prefixed `open:` for a defect another change is fixing (run
and logged, not failed: repro.txt names the item); WANT a fragment stdout+stderr must contain ('' for none).
The harness substitutes {testdata} (the repository's testdata/) and {dir}
(its own temporary directory of bad files, see setupProbes). Every probe
that exits 0, 3 or 4 has its answer checked for sanity (no negative or
non-finite sizes; a plan's peak is its ledger's sum and at least every
phase's; fits iff the deciding peak is within the capacity).

The expected outcome of a value is a rule (a value that does not parse,
or is outside what the flag means, is refused in one line naming the
flag); ACCEPT lists the (flag, value) pairs that are meaningful and
answered, each with the reason. Edit the rules or ACCEPT, not the .txt.
"""
import os
import shlex

HERE = os.path.dirname(os.path.abspath(__file__))

# Hostile values by flag type. 2^31-1, 2^62, 2^63-1 and 2^63 (int64's
# overflow), non-numbers, an empty string, full-width digits (unicode) and a
# size where a count belongs.
INTS = ["0", "-1", "NaN", "Inf", "1e309", "2147483647", "4611686018427387904",
        "9223372036854775807", "9223372036854775808", "", "\uff15", "1GiB"]
INTS_SHORT = ["0", "-1", "NaN", "9223372036854775808", ""]
FLOATS = ["0", "-1", "NaN", "Inf", "-Inf", "1e309", "2147483647", "", "\uff11", "1GiB"]
SIZES = ["0", "-1", "NaN", "Inf", "1e309", "9223372036854775807", "16EiB", "1e30GiB", "",
         "\uff11GiB", "1 parsecs", "-1GiB"]
ENUMS = ["", "NaN", "-1", "\ufb02ash", "x" * 300, "gpt2\x01"]
BOOLS = ["maybe", "2", ""]
DURATIONS = ["0", "-1s", "NaN", "1e309h", "9223372036854775807h", "", "\uff15s", "5"]

# The flags every planning command shares (cli's plan flags), by type.
PLAN_INTS = ["accum", "dp", "ep", "gen-tokens", "gpus-per-node", "micro-batch", "nodes", "pp",
             "pp-interleave", "seq", "tp", "zero"]
SERVE_INTS = ["block-size", "context", "max-model-len", "max-num-batched-tokens", "max-num-seqs", "prompt"]
PLAN_SIZES = ["budget", "host-memory"]
SERVE_SIZES = ["total-memory"]
PLAN_ENUMS = ["attention", "checkpoint", "fit-on", "kernels", "mode", "optimizer", "optimizer-impl",
              "pp-schedule", "precision", "recipe", "offload", "lora", "alloc-conf", "gpu", "model", "set"]
SERVE_ENUMS = ["dtype", "kv-cache-dtype", "quantization"]
PLAN_BOOLS = ["chunked-prefill", "enforce-eager", "first-step", "fsdp", "no-chart", "no-reserved",
              "no-timeline", "qlora", "sp", "json"]

PLAN = ["plan", "--model", "gpt2", "--seq", "128", "--json", "--no-timeline"]
SERVE = ["plan", "--mode", "serve", "--model", "gpt2", "--gpu", "h100", "--json", "--no-timeline"]
BASES = {
    "plan": PLAN,
    "compare": ["compare", "--model", "gpt2", "--seq", "128", "--gpu", "h100", "--json"],
    "fit": ["fit", "--model", "gpt2", "--seq", "128", "--gpu", "h100", "--json"],
    "max": ["max", "--model", "gpt2", "--seq", "128", "--gpu", "h100", "--micro-batch", "?", "--json"],
    "diagnose": ["diagnose", "--model", "gpt2", "--seq", "128", "--gpu", "h100"],
}

# (command, flag, value) -> (exit, want, why): values that mean something.
ACCEPT = {}


def accept(cmds, flag, values, code, want, why):
    for c in cmds:
        for v in values:
            ACCEPT[(c, flag, v)] = (code, want, why)


PLANNERS = ["plan", "compare", "fit", "max", "diagnose", "serve"]
accept(PLANNERS, "gen-tokens", ["0"], 0, "", "0 is the default: no generated tokens")
accept(PLANNERS, "zero", ["0"], 0, "", "0 is the default: no ZeRO")
# --seq 0 is refused where the job has a sequence to set (round 26: 0 had run as the default); serve mode's
# --seq is only its profile's and keeps 0 as "unset".
accept(["serve"], "seq", ["0"], 0, "", "0 is the default: min(2048, the model's positions)")
# An empty string is the flag's default (no budget, no GPU, no LoRA, ...).
for f in ["budget", "host-memory", "checkpoint", "offload", "lora", "alloc-conf", "gpu", "total-memory",
          "quantization"]:
    accept(PLANNERS, f, [""], 0, "", "'' is --%s's default" % f)
accept(PLANNERS, "pp-schedule", [""], 0, "warning: --pp-schedule", "'' is the default; warned: no --pp")
for c in ["fit", "compare"]:
    for f in ["allow", "deny", "emit"]:
        accept([c], f, [""], 0, "", "'' is the default: nothing allowed, denied or emitted")
# Training ignores --gen-tokens and a single stage --pp-interleave, with a
# warning; under the token limit (2^34) the value is only warned about.
accept(["plan"], "gen-tokens", ["2147483647", "4611686018427387904", "9223372036854775807"], 0, "warning: --gen-tokens",
       "ignored in training, warned")
accept(["plan"], "pp-interleave", ["2147483647", "4611686018427387904", "9223372036854775807"], 0,
       "warning: --pp-interleave", "ignored without --pp, warned")
# --gpus-per-node only groups ranks into nodes: one GPU's plan is the same.
accept(["plan"], "gpus-per-node", ["2147483647", "4611686018427387904", "9223372036854775807"], 0, "",
       "a node of any size holds the one GPU planned")
accept(["fit", "max"], "gpu", [""], 1, "--gpu", "fit and max need a --gpu")
# A dense model has no experts to split: said so by name.
accept(PLANNERS, "ep", ["2147483647", "4611686018427387904", "9223372036854775807"], 1, "expert parallel", "")
accept(["fit"], "headroom", ["0"], 0, "", "no headroom")
accept(["explain"], "against", [""], 0, "", "'' is the default: no comparison")
# memplan serve: a limit of 0 is refused naming it (round 26: it had run as the server's default), and
# --cache-entries -1 turns the cache off; it then serves until stopped.
accept(["serve-http"], "cache-entries", ["-1"], "serves", "", "-1: no cache")
accept(["extender"], "margin", ["-1GiB"], 1, "--margin", "")
accept(["validate"], "tolerance", ["-0.5"], 1, "--tolerance", "")

# The word a refusal names a flag by when it is not the flag itself: none
# (every refusal of a flag's value starts with the flag, cli's
# TestChoiceFlagRefusals).
NOUN = {}


def lines_for(cmd, base, flag, values):
    out = []
    for v in values:
        code, want, why = 1, NOUN.get(flag, "--" + flag), None
        if (cmd, flag, v) in ACCEPT:
            code, want, why = ACCEPT[(cmd, flag, v)]
        out.append((code, want, base + ["--" + flag, v], why))
    return out


def flag_probes():
    ps = []
    for cmd, base in BASES.items():
        full = cmd == "plan"
        for f in PLAN_INTS:
            ps += lines_for(cmd, base, f, INTS if full else INTS_SHORT)
        for f in PLAN_SIZES:
            ps += lines_for(cmd, base, f, SIZES if full else SIZES[:4] + [""])
        for f in PLAN_ENUMS:
            if f == "alloc-conf" and cmd != "plan":
                continue  # plan's alone: the reserved prediction
            ps += lines_for(cmd, base, f, ENUMS if full else ENUMS[:3])
        for f in PLAN_BOOLS:
            if cmd != "plan" and f in ("no-chart", "no-reserved", "no-timeline", "json", "first-step"):
                continue
            ps += [(1, "--" + f, base + ["--" + f + "=" + v], None) for v in (BOOLS if full else BOOLS[:1])]
    for f in SERVE_INTS:
        ps += lines_for("serve", SERVE, f, INTS)
    for f in SERVE_SIZES:
        ps += lines_for("serve", SERVE, f, SIZES)
    for f in SERVE_ENUMS:
        ps += lines_for("serve", SERVE, f, ENUMS)
    ps += lines_for("serve", SERVE, "gpu-memory-utilization", FLOATS)
    # Command-specific flags.
    fit = BASES["fit"]
    ps += lines_for("fit", fit, "global-batch", INTS)
    ps += lines_for("fit", fit, "gpus", INTS)
    ps += lines_for("fit", fit, "headroom", FLOATS)
    for f in ["allow", "deny", "emit"]:
        ps += lines_for("fit", fit, f, ENUMS)
    ps += lines_for("compare", BASES["compare"], "allow", ENUMS)
    mx = ["max", "--mode", "serve", "--model", "gpt2", "--gpu", "h100", "--context", "1024", "--json"]
    ps += [(1, "--requests", mx + ["--requests", v], None) for v in INTS]
    ps += [(1, "--micro-batch", BASES["max"][:-3] + ["--micro-batch", v, "--json"], None) for v in ["??", "?1", "-?"]]
    diag = ["diagnose", "{testdata}/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl"]
    ps += lines_for("diagnose", diag, "capacity", SIZES)
    ps += lines_for("diagnose", diag + ["--capacity", "1GiB"], "device", ["-2", "2147483647", "9223372036854775808", "NaN", ""])
    expl = ["explain", "{testdata}/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl"]
    ps += lines_for("explain", expl, "device", ["-2", "2147483647", "9223372036854775808", "NaN", ""])
    ps += lines_for("explain", expl, "against", ENUMS)
    val = ["validate", "{testdata}/torch/measured.json"]
    # A bare 3 is not 3% (it was read as 300%): refused, with both spellings.
    ps += lines_for("validate", val, "tolerance", ["-1%", "NaN", "Inf", "1e309", "", "\uff13%", "3GiB", "-0.5", "%", "3"])
    pack = ["pack", "{dir}/jobs.yaml", "--gpus", "2xh100", "--json"]
    ps += lines_for("pack", pack, "gpus", ["0xh100", "-1xh100", "9223372036854775808xh100", "2147483647xh100",
                                           "NaNxh100", "2xnope", "", "x", "2x", "\uff12xh100"])
    ps += lines_for("pack", pack, "margin", SIZES[1:])
    ps += lines_for("pack", pack, "policy", ENUMS)
    ps += lines_for("pack", pack, "plot-policy", ENUMS)
    for cmd in ["gpus", "models"]:
        ps += [(1, "--output", [cmd, "--output", v], None) for v in ["", "yaml", "\u006a\u0073\u006f\u006e\u0301"]]
    ps += [(1, "unknown recipe", ["recipes", v], None) for v in ["NaN", "\ufb02ash", "x" * 300]]
    # Servers: a bad value exits 1 before listening.
    srv = ["serve", "--addr", "127.0.0.1:0"]
    for f in ["cache-bytes", "cache-entries", "max-body", "max-file-body", "max-in-flight", "max-queue"]:
        ps += lines_for("serve-http", srv, f, INTS_SHORT + ["1e309", "\uff15"])
    for f in ["queue-wait", "timeout"]:
        ps += lines_for("serve-http", srv, f, DURATIONS)
    ps += lines_for("serve-http", ["serve"], "addr", ["", "nope", "127.0.0.1:99999", "127.0.0.1:-1", "[::1"])
    ext = ["extender", "--addr", "127.0.0.1:0", "--pods", "{testdata}/../k8s/testdata/pods.json"]
    ps += lines_for("extender", ext, "margin", SIZES[1:])
    ps += lines_for("extender", ext, "policy", ENUMS)
    ps += lines_for("extender", ext, "timeout", DURATIONS)
    ps += lines_for("extender", ["extender", "--pods", "{testdata}/../k8s/testdata/pods.json"], "addr",
                    ["", "nope", "127.0.0.1:99999", "[::1"])
    return ps


# Bad files: a path in {dir} (setupProbes) or absolute, and the fragment
# its refusal must carry ('' for the file's name: a reader may name it by
# its base name).
BAD = [
    ("{dir}/empty", ""),
    ("/dev/zero", "not a regular file"),
    ("{dir}/fifo", "not a regular file"),
    ("{dir}/adir", ""),
    ("{dir}/loop", ""),
    ("{dir}/trunc.json", ""),
    ("{dir}/trunc.yaml", ""),
    ("{dir}/huge", ""),
    ("{dir}/junk", ""),
    ("{dir}/nope", ""),
    ("{dir}/nul.json", ""),
]
# Each file-taking flag or argument: the command, what follows the file,
# and a valid file of the wrong kind for it.
FILE_INPUTS = [
    (["plan", "--model"], [], "{testdata}/torch/lm.trace.json"),
    (["plan", "--model", "gpt2", "--seq", "64", "--recipe"], [], "{testdata}/torch/lm.trace.json"),
    (["plan", "--model", "gpt2", "--seq", "64", "--cluster"], [], "{testdata}/pack/mix.yaml"),
    (["plan", "--graph"], [], "{testdata}/torch/gpt2_tiny.config.json"),
    (["plan", "--graph", "{testdata}/torch/lm.trace.json", "--workload"], [], "{testdata}/pack/mix.yaml"),
    (["compare", "--gpu", "h100", "--model"], [], "{testdata}/pack/mix.yaml"),
    (["fit", "--gpu", "h100", "--model"], [], "{testdata}/torch/measured.json"),
    (["max", "--gpu", "h100", "--micro-batch", "?", "--model"], [], "{testdata}/torch/lm.trace.json"),
    (["diagnose", "--gpu", "h100", "--model"], [], "{testdata}/pack/arrivals.yaml"),
    (["explain"], [], "{testdata}/torch/lm.trace.json"),
    (["diagnose"], [], "{testdata}/torch/measured.json"),
    (["explain", "{testdata}/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl", "--against"], [],
     "{testdata}/torch/lm.trace.json"),
    (["validate"], [], "{testdata}/torch/lm.trace.json"),
    (["validate", "--published"], [], "{testdata}/torch/measured.json"),
    (["pack"], ["--gpus", "2xh100"], "{testdata}/torch/lm.trace.json"),
    (["pack", "{dir}/jobs.yaml", "--gpus", "2xh100", "--arrivals"], [], "{testdata}/pack/mix.yaml"),
    (["recipes"], [], "{testdata}/torch/lm.trace.json"),
    (["extender", "--addr", "127.0.0.1:0", "--pods"], [], "{testdata}/torch/measured.json"),
]
# Output flags × bad destinations, each with the flag's own extension:
# d.EXT a directory, p.EXT a named pipe, l.EXT a symbolic link to itself,
# full.EXT a link to /dev/full, nope/x.EXT in a missing directory; and a
# wrong extension. Every one is refused and leaves nothing behind.
FILE_OUTPUTS = [
    (["plan", "--model", "gpt2", "--seq", "64", "--svg"], "svg"),
    (["plan", "--model", "gpt2", "--seq", "64", "--png"], "png"),
    (["explain", "{testdata}/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl", "--png"], "png"),
    (["pack", "{dir}/jobs.yaml", "--gpus", "2xh100", "--svg"], "svg"),
    (["fit", "--model", "gpt2", "--seq", "64", "--gpu", "h100", "--recipe", "deepspeed", "--emit", "deepspeed",
      "--emit-out"], "json"),
]


def file_probes():
    ps = []
    for head, tail, wrong in FILE_INPUTS:
        for path, frag in BAD + [(wrong, "")]:
            ps.append((1, frag or os.path.basename(path), head + [path] + tail, None))
    for head, ext in FILE_OUTPUTS:
        for name in ["d", "p", "l", "full", "nope/x"]:
            path = "{dir}/%s.%s" % (name, ext)
            ps.append((1, os.path.basename(path), head + [path], None))
        if ext != "json":
            ps.append((1, "want a file name ending in", head + ["{dir}/x.txt"], None))
    return ps


# Valid jobs at the edges: each answers (no --gpu or --budget: exit 0) and
# the harness checks the answer's sanity. One option at a time over its
# values, on a dense, a GQA, a mixture-of-experts and an encoder model,
# and the limits themselves (engine/limits.go: 2^34 tokens less one
# sequence, 2^30 micro-steps, 2^24 GPUs).
EDGE_MODELS = ["gpt2", "llama-3.2-1b", "mixtral-8x7b", "bert-base"]
EDGE_OPTIONS = [
    ["--precision", "fp32"], ["--precision", "amp-fp16"], ["--precision", "bf16"], ["--precision", "pure-bf16"],
    ["--optimizer", "sgd"], ["--optimizer", "adafactor"], ["--optimizer", "adamw8bit"], ["--optimizer", "lion"],
    ["--optimizer-impl", "fused"], ["--optimizer-impl", "single"], ["--attention", "eager"],
    ["--checkpoint", "full"], ["--checkpoint", "every=2"], ["--checkpoint", "selective"],
    ["--offload", "activations"], ["--offload", "optimizer"], ["--dp", "8", "--zero", "1"], ["--dp", "8", "--zero", "3"],
    ["--dp", "8", "--fsdp", "--offload", "params"], ["--tp", "2"], ["--tp", "2", "--sp"], ["--pp", "2", "--accum", "8"],
    ["--pp", "2", "--accum", "8", "--pp-schedule", "gpipe"], ["--lora", "r=16,alpha=32"], ["--mode", "infer", "--gen-tokens", "64"],
    ["--micro-batch", "64"], ["--accum", "1073741824"], ["--first-step=false"], ["--no-reserved"],
    ["--alloc-conf", "expandable_segments:True"], ["--kernels", "cpu"], ["--recipe", "deepspeed"],
]
EDGE_LIMITS = [
    ["plan", "--model", "gpt2", "--seq", "1024", "--micro-batch", "2097152", "--json", "--no-timeline"],
    ["plan", "--model", "gpt2", "--seq", "128", "--accum", "1073741824", "--dp", "16", "--json", "--no-timeline"],
    ["plan", "--model", "llama-3-8b", "--seq", "128", "--dp", "1048576", "--tp", "4", "--pp", "4", "--accum", "4",
     "--json", "--no-timeline"],
    ["plan", "--model", "llama-3.2-1b", "--mode", "infer", "--seq", "1", "--gen-tokens", "131071", "--json",
     "--no-timeline"],
    ["plan", "--model", "deepseek-v3", "--seq", "4096", "--ep", "32", "--dp", "32", "--zero", "3", "--json",
     "--no-timeline", "--no-reserved"],
    ["plan", "--model", "llama-3-70b", "--attention", "eager", "--seq", "131072", "--json", "--no-timeline",
     "--no-reserved", "--first-step=false"],
    ["plan", "--mode", "serve", "--model", "llama-3.1-8b", "--gpu", "h200", "--tp", "8", "--max-model-len", "131072",
     "--json", "--no-timeline"],
    ["compare", "--model", "llama-3-8b", "--gpu", "h100", "--seq", "8192", "--micro-batch", "64", "--json"],
    ["fit", "--model", "llama-3-8b", "--gpu", "h100", "--gpus", "16777216", "--global-batch", "16777216", "--seq", "128",
     "--json"],
    ["max", "--model", "gpt2", "--gpu", "b200", "--seq", "?", "--micro-batch", "1", "--json"],
    ["max", "--mode", "serve", "--model", "gpt2", "--gpu", "h100", "--requests", "?", "--context", "1024", "--json"],
    ["diagnose", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--seq", "4096", "--micro-batch", "8"],
]


# What a model cannot do, refused in one line: (model or '', first option
# word) -> (exit, want).
EDGE_REFUSED = {
    ("", "selective"): (1, "--checkpoint selective recomputes eager attention's score matrices and needs --attention eager"),
    ("bert-base", "--tp"): (1, "tensor parallel"),
    ("bert-base", "--mode"): (1, "encoder"),
    ("mixtral-8x7b", "--sp"): (1, "sequence parallel"),
}
# Outcomes of the limits other than 0: what does not fit (compare 4,
# diagnose 3) and what is refused. fit at 2^24 GPUs is held to the probes'
# 10 s and 2 GB like the rest since cost.Topology.Span's closed form
# (1.2 s CPU, 270 MB; it was open while it took 2-67 s).
EDGE_LIMIT_CODES = {"compare": (4, ""), "diagnose": (3, "")}


# Ordinary jobs whose reports crashed or said something wrong, found by
# cmd/memplan's TestSweep (issue 15's crash sweep): (exit, want, args, what it was).
EDGE_SWEEP = [
    (0, "sequence ×2 (2048): n/a: ", ["diagnose", "--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--micro-batch", "8"],
     "sweep: a row that cannot be planned (sequence x2 past gpt2's positions) misaligned the rows under it"),
    (0, "", ["compare", "--model", "vit-base", "--gpu", "a100-40gb", "--precision", "fp32", "--optimizer", "sgd", "--pp", "2",
         "--accum", "4", "--json"],
     "sweep: offloading activations changed the step's FLOPs by -1.3% (the slowest stage's FLOPs were compared)"),
    (0, "after the last of 2 micro-steps", ["plan", "--model", "gpt2", "--gpu", "rtx-4090", "--seq", "1", "--accum", "2"],
     "sweep: the optimizer's peak was said to be in micro-step 1 of 2"),
    (0, "", ["plan", "--model", "llama-3.2-1b", "--tp", "2", "--sp", "--seq", "2", "--json", "--no-timeline"],
     "sweep: panicked (RMSNorm's weight x hidden at one token per rank took the weight's shape [H])"),
    (4, "", ["max", "--model", "llama-2-13b", "--gpu", "h100-sxm-mig-3g.40gb", "--micro-batch", "8", "--seq", "?", "--tp", "2",
         "--sp", "--json"],
     "sweep: panicked in its lever's plan of micro-batch 1 x seq 2 (the same shape)"),
    (0, "", ["plan", "--model", "gpt2", "--pp", "2", "--accum", "4", "--recipe", "litgpt", "--json", "--no-timeline"],
     "sweep: refused as 'pipeline cannot place op 133 (logits = model(...) (rebinds)) on a stage'"),
    (1, "does not model zero_grad between forward and backward", ["plan", "--model", "gpt2", "--pp", "2", "--accum", "4",
                                                                 "--set", "loop.zero-grad=after-forward"],
     "sweep: refused by op index; the carried gradients are one tensor of the whole model, not per stage"),
    (1, "--seq 1024 + --gen-tokens 64 = 1088 tokens exceed gpt2-large's 1024 learned positions",
     ["plan", "--model", "gpt2-large", "--mode", "infer", "--seq", "1024", "--gen-tokens", "64"],
     "sweep: the refusal said '--seq 1088', a value nobody gave"),
    (0, "", ["plan", "--model", "gpt2", "--gpu", "a100-40gb-mig-1g.5gb", "--seq", "1024", "--micro-batch", "2"],
     "sweep: a MIG slice's name (a100-40gb-...) is no negative size in the text"),
]


# Every catalog model as a user first runs it: plan (the text, with the
# reserved replay and the next step), compare and max --micro-batch ? on an
# H100 at the defaults. The exit says whether the job fits: compare's as
# measured (0 as given, 3 with a strategy, 4 with none; the default 0), plan
# 3 and max 4 where compare is not 0. The large mixtures of experts are
# what the limits bound (deepseek-v3's plan was 55 s and 5.8 GB); the runs
# still past them on this 2-core host, or inside them without margin, are
# `open:` (README, Reliability).
CATALOG = sorted(f[:-5] for f in os.listdir(os.path.join(HERE, "..", "..", "models", "catalog")) if f.endswith(".json"))
CATALOG_COMPARE_EXIT = {
    "deepseek-v2": 4, "deepseek-v2-lite": 4, "deepseek-v3": 4, "falcon-7b": 4, "gemma-2-9b": 4, "gemma-7b": 3,
    "llama-2-13b": 4, "llama-2-70b": 4, "llama-2-7b": 3, "llama-3-70b": 4, "llama-3-8b": 3, "llama-3.1-8b": 3,
    "mistral-7b": 3, "mixtral-8x7b": 4, "qwen2.5-32b-it": 4, "qwen2.5-7b": 3, "qwen3-30b-a3b": 4, "qwen3-8b": 3,
}
CATALOG_OPEN = {}
# Jobs on the largest still at their limits on this host (each entry: exit,
# args, why).
CATALOG_OPEN_JOBS = []

# The same three jobs as transformers 5.x runs them (--recipe hf5), hf5's
# refusal of a float16 checkpoint, and a long pipeline's accumulation.
CATALOG_HF5_JOBS = [
    (4, "", ["compare", "--model", "deepseek-v3", "--gpu", "h100", "--json", "--recipe", "hf5"],
     "The same three jobs as transformers 5.x runs them (--recipe hf5: one grouped matmul a projection for the\n"
     "# experts, not the 4.46 loop of 256): 0.1-0.3 s and under 150 MB."),
    (3, "", ["plan", "--model", "deepseek-v3", "--gpu", "h100", "--accum", "8", "--recipe", "hf5"], None),
    (3, "", ["plan", "--model", "deepseek-v3", "--gpu", "h100", "--pp", "4", "--accum", "8", "--recipe", "hf5"], None),
    (1, "llama-2-7b's checkpoint is float16", ["plan", "--model", "llama-2-7b", "--recipe", "hf5"], None),
    (3, "", ["plan", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--pp", "4", "--accum", "64"],
     "A priced 1F1B pipeline past 2p+3 micro-steps: p+1 simulated, each stage's step extrapolated from p+1 and p+2\n"
     "# (engine.planPipelineShortAccum; 30 s and 4.3 GB before round 15, 4 s and 1.1 GB after)."),
]


# Past their open: in round 16 (compare deepseek-v3 above too): the next step's cache holds the plan's own
# programs in place of the ones autocast's cache made them from
# (engine.LeverCache), and the lever runs after the reserved replay.
CATALOG_CLOSED_JOBS = [
    (3, "", ["plan", "--model", "deepseek-v3", "--gpu", "h100", "--accum", "8"],
     "Three simulated micro-steps of 470,000 ops and four to price the step, the reserved replay and the next step:\n"
     "# 6.7-6.8 s and 1,805-1,827 MiB alone in round 16, 8.2 s and 1,841 MiB in the harness (2.16-2.35 GiB before)."),
    (3, "", ["plan", "--model", "deepseek-v3", "--gpu", "h100", "--pp", "4", "--accum", "8"],
     "Four stages of eight priced micro-steps, the first step's eight, the reserved replay and the next step on each\n"
     "# stage's own few: open until round 19 (7.1-7.6 s alone in a quiet hour, 10.1 s alone in CI's harness in a slow\n"
     "# one); round 19's one pass of the pipeline transform over a stage's ops (strategy BenchmarkPipelineStageDeepSeekV3,\n"
     "# -39 %): 5.9-6.5 s alone and 1.50 GiB, 8.0-8.4 s beside plan --accum 8, where the same hour's build before took 7.2-7.8 s."),
]


def catalog_probes():
    ps = []
    for m in CATALOG:
        c = CATALOG_COMPARE_EXIT.get(m, 0)
        for cmd, code, extra in (("plan", 3 if c else 0, []), ("compare", c, ["--json"]),
                                 ("max", 4 if c else 0, ["--micro-batch", "?", "--json"])):
            why = CATALOG_OPEN.get((cmd, m))
            ps.append(("open:%d" % code if why else code, "", [cmd, "--model", m, "--gpu", "h100"] + extra,
                       "open: " + why if why else None))
    for code, args, why in CATALOG_OPEN_JOBS:
        ps.append(("open:%d" % code, "", args, "open: " + why))
    return ps + CATALOG_HF5_JOBS + CATALOG_CLOSED_JOBS


def edge_probes():
    ps = []
    for m in EDGE_MODELS:
        for o in EDGE_OPTIONS:
            code, want = 0, ""
            for (em, word), cw in EDGE_REFUSED.items():
                if em in ("", m) and word in o:
                    code, want = cw
            ps.append((code, want, ["plan", "--model", m, "--seq", "128", "--json", "--no-timeline"] + o, None))
    for a in EDGE_LIMITS:
        code, want = EDGE_LIMIT_CODES.get(a[0], (0, ""))
        ps.append((code, want, a, None))
    # Between build's limit (2^31 tokens a model's graph is built for) and
    # engine's (2^34): refused, naming both flags and the limit.
    ps += [(code, want, args, why) for code, want, args, why in EDGE_SWEEP]
    ps.append((1, "--micro-batch 16777215 × --seq 1024 is over the limit of 2^31 tokens", ["plan", "--model", "gpt2", "--seq", "1024", "--micro-batch", "16777215"], None))
    return ps + catalog_probes()


def write(name, probes, title):
    with open(os.path.join(HERE, name), "w") as f:
        f.write("# " + title + "\n# Written by gen.py (edit it, not this file). EXIT WANT ARGS...\n")
        for code, want, args, why in probes:
            if why:
                f.write("# " + why + "\n")
            f.write(" ".join([str(code), shlex.quote(want)] + [shlex.quote(a) for a in args]) + "\n")


if __name__ == "__main__":
    write("flags.txt", flag_probes(), "Every command's flags × hostile values.")
    write("files.txt", file_probes(), "Every file-taking flag and argument × bad files and bad destinations.")
    write("edges.txt", edge_probes(), "Valid jobs at the edges: answered, and the answers checked for sanity.")
