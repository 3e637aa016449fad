"""export-hf: a transformers causal LM built from its config.json, traced under fake tensors, against memplan's
catalog path (`memplan plan --model CONFIG --recipe hf`) on the same config."""

import json
import os
import subprocess
import sys

import pytest
import torch

from memplan_torch import ExportError, compat
from memplan_torch import hf
from memplan_torch.hf import export_hf, load_config, transformers_available
from memplan_torch.schema import validate_trace

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

needs_hf = pytest.mark.skipif(not (compat.fake_tensors_available() and transformers_available()),
                              reason="export-hf needs PyTorch 2.x and transformers (python/requirements-torch2.txt)")

# a tiny Llama (grouped-query attention: 4 heads, 2 key/value heads)
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "float32"}
B, S = 2, 32


def _plan(memplan, *args):
    r = subprocess.run([memplan, "plan", "--micro-batch", str(B), "--json", "--no-timeline", "--kernels", "cpu"]
                       + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def _saved(doc, prefix):
    """(op, dtype, shape) of the storages saved for backward that ops of modules under `prefix` allocated."""
    out = []
    for e in doc["events"]:
        if e["module"].startswith(prefix):
            out.extend((e["op"], s["dtype"], tuple(s["shape"])) for s in e["alloc"] if s["saved"])
    return out


def test_load_config_overrides(tmp_path):
    cat = os.path.join(REPO, "models", "catalog", "llama-3.2-1b.json")
    c = load_config(cat, ["num_hidden_layers=2", "hidden_size=64", "intermediate_size=128", "vocab_size=256"])
    assert (c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["vocab_size"]) == (2, 64, 128, 256)
    assert c["head_dim"] == 2  # followed hidden_size / num_attention_heads (64 / 32)
    assert c["bos_token_id"] is None and c["eos_token_id"] is None  # 128000 is outside a 256-token vocabulary
    assert load_config(cat, ["head_dim=8", "hidden_size=64"])["head_dim"] == 8
    with pytest.raises(ExportError):
        load_config(cat, ["num_hidden_layers"])


def test_catalog_configs_pass_the_size_bounds():
    for name in hf.catalog_names():
        load_config(os.path.join(REPO, "models", "catalog", name + ".json"))  # none refused


def test_config_file_sizes_are_checked(tmp_path):
    cp = tmp_path / "bad.json"
    cp.write_text(json.dumps(dict(TINY, num_hidden_layers=0)))
    with pytest.raises(ExportError) as ei:
        load_config(str(cp))
    assert "bad.json: num_hidden_layers 0: the number of layers must be" in str(ei.value)


@needs_hf
@pytest.mark.parametrize("precision", ["fp32", "pure-bf16"])
def test_export_hf_against_catalog(tmp_path, precision, memplan_bin):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    out = str(tmp_path / "trace.json")
    doc = export_hf(str(cfg), out, S, batch=B, precision=precision, fit_seq=False)
    validate_trace(json.loads(open(out).read()))
    assert doc["execution"] == "fake" and doc["trace_batch"] == B
    h, f, L, V, kv, hd = 64, 128, 2, 256, 2, 16
    n = V * h * 2 + L * (h * h * 2 + h * kv * hd * 2 + 3 * h * f + 2 * h) + h
    assert doc["n_params"] == n
    el = 4 if precision == "fp32" else 2
    layer = _saved(doc, "model.layers.0")
    # transformers' eager LlamaRMSNorm: the float32 copy of the input (a copy in pure-bf16, the input itself in
    # fp32), rsqrt's [B, S, 1], and the normalized input cast back (pure-bf16) / times the weight
    norm = _saved(doc, "model.layers.0.input_layernorm")
    if precision == "pure-bf16":
        assert norm == [("aten._to_copy.default", "float32", (B, S, h)), ("aten.rsqrt.default", "float32", (B, S, 1)),
                        ("aten._to_copy.default", "bfloat16", (B, S, h)), ("aten.mul.Tensor", "bfloat16", (B, S, h))]
    else:
        assert norm == [("aten.rsqrt.default", "float32", (B, S, 1)), ("aten.mul.Tensor", "float32", (B, S, h)),
                        ("aten.mul.Tensor", "float32", (B, S, h))]
    # attention: transformers 5.x passes no mask and enable_gqa=True to sdpa when there is no padding, so no
    # [B, 1, S, S] mask and no repeat_kv copy: k and v are saved at the key/value heads
    shapes = sorted(x[2] for x in layer if len(x[2]) == 4)
    assert shapes == sorted([(B, 4, S, hd), (B, kv, S, hd), (B, 4, S, hd)]), shapes  # q, k (roped), sdpa's output
    if memplan_bin is None:
        return
    # transformers 5.x without an attention mask hands the grouped heads to SDPA (enable_gqa): the catalog's hf
    # recipe follows 4.46 (repeat_kv always), so the comparison sets attention.repeat-kv=false.
    cat = _plan(memplan_bin, "--model", str(cfg), "--seq", str(S), "--precision", precision, "--recipe", "hf",
                "--set", "attention.repeat-kv=false")
    gr = _plan(memplan_bin, "--graph", out)
    diffs = {p: (cat["phases"][p]["peak_bytes"] - gr["phases"][p]["peak_bytes"]) / gr["phases"][p]["peak_bytes"]
             for p in ("forward", "backward", "optimizer")}
    # Per layer the catalog and the trace save the same bytes: RMSNorm's float32 copy, k and v at the key/value
    # heads, sdpa's output (no copy before o_proj: its memory is already [B, S, heads, head_dim]).
    per_layer = cat["saved_activations"]["by_module"]["model.layers.0"] - \
        gr["saved_activations"]["by_module"]["model.layers.0"]
    assert per_layer == 0, per_layer
    # Backward and optimizer agree within 2% in both precisions (fp32: forward too). pure-bf16's forward peak is
    # 2.8% higher in the trace (measured with transformers 5.24.0): a transient at the loss of this tiny model
    # (vocab 256) the catalog lacks, not yet explained; bounded here so a change shows.
    for p in ("backward", "optimizer"):
        assert abs(diffs[p]) <= 0.02, diffs
    assert -0.03 <= diffs["forward"] <= 0.02, diffs


@needs_hf
def test_cli_export_hf_from_catalog(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    out = tmp_path / "t.json"
    cat = os.path.join(REPO, "models", "catalog", "llama-3.2-1b.json")
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "export-hf", cat, "--seq", "16", "--batch", "2",
                        "--precision", "amp-bf16", "--no-seq-fit", "--out", str(out),
                        "--override", "num_hidden_layers=1", "--override", "hidden_size=64",
                        "--override", "num_attention_heads=4", "--override", "num_key_value_heads=2",
                        "--override", "intermediate_size=128", "--override", "vocab_size=256"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert r.returncode == 0, r.stdout.decode()
    doc = json.loads(out.read_text())
    assert doc["execution"] == "fake" and "amp-bf16" in doc["name"]
    assert any(s["dtype"] == "bfloat16" for e in doc["events"] for s in e["alloc"])  # autocast ran


@pytest.mark.skipif(compat.fake_tensors_available(), reason="checks the refusal on PyTorch 1.x")
def test_export_hf_refused_on_torch1(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    r = subprocess.run([sys.executable, "-m", "memplan_torch", "export-hf",
                        os.path.join(REPO, "models", "catalog", "llama-3.2-1b.json"), "--seq", "16",
                        "--out", str(tmp_path / "t.json")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = r.stderr.decode().strip()
    assert r.returncode == 1 and err.count("\n") == 0 and "needs PyTorch 2.x" in err, err


# Every catalog family, scaled down (2 layers, hidden 64, 4 heads, vocabulary 256) but with its real structure:
# model_type -> (catalog config, overrides). The catalog's config keeps everything the overrides leave alone
# (grouped-query heads, biases, partial rotary, soft-capping, sliding windows, tied embeddings, experts).
SMALL = ["num_hidden_layers=2", "hidden_size=64", "num_attention_heads=4", "num_key_value_heads=2", "head_dim=16",
         "intermediate_size=128", "vocab_size=256"]
FAMILIES = {
    "llama": ("llama-3.2-1b", SMALL),
    "mistral": ("mistral-7b", SMALL),
    "mixtral": ("mixtral-8x7b", SMALL + ["num_local_experts=4"]),
    "qwen2": ("qwen2.5-0.5b", SMALL),
    "qwen3": ("qwen3-8b", SMALL),
    "qwen3_moe": ("qwen3-30b-a3b", SMALL + ["num_experts=4", "num_experts_per_tok=2", "moe_intermediate_size=32"]),
    "gemma": ("gemma-2b", SMALL[:3] + ["num_key_value_heads=1"] + SMALL[4:]),
    "gemma2": ("gemma-2-9b", SMALL + ["sliding_window=16", "query_pre_attn_scalar=16"]),
    # 3 layers with a pattern of 2: sliding, full, sliding (both rotary pairs, q/k norms)
    "gemma3_text": ("gemma-3-1b", ["num_hidden_layers=3"] + SMALL[1:3] + ["num_key_value_heads=1"] + SMALL[4:]
                    + ["sliding_window=16", "sliding_window_pattern=2", "query_pre_attn_scalar=16"]),
    "phi3": ("phi-3-mini", SMALL[:3] + ["num_key_value_heads=4"] + SMALL[5:]),
    "phi": ("phi-1.5", SMALL[:3] + SMALL[5:]),
    # multi-query: one key/value head whatever the heads; ffn_hidden_size defaults to 4 * hidden
    "falcon": ("falcon-7b", SMALL[:3] + ["vocab_size=256"]),
    "gpt_neox": ("pythia-160m", SMALL[:3] + ["intermediate_size=256", "vocab_size=256"]),
    # latent attention (a plain q_proj in V2-Lite, q_a_proj/q_b_proj in V3), one dense layer then expert layers
    # with routed and shared experts; every key/value head latent-projected (no grouped heads)
    "deepseek_v2": ("deepseek-v2-lite", ["num_hidden_layers=3"] + SMALL[1:3] + ["num_key_value_heads=4"] + SMALL[5:]
                    + ["kv_lora_rank=32", "qk_nope_head_dim=16", "qk_rope_head_dim=8", "v_head_dim=16",
                       "n_routed_experts=4", "num_experts_per_tok=2", "moe_intermediate_size=32", "n_shared_experts=2",
                       "first_k_dense_replace=1"]),
    "deepseek_v3": ("deepseek-v3", ["num_hidden_layers=3"] + SMALL[1:3] + ["num_key_value_heads=4"] + SMALL[5:]
                    + ["q_lora_rank=24", "kv_lora_rank=32", "qk_nope_head_dim=16", "qk_rope_head_dim=8",
                       "v_head_dim=16", "n_routed_experts=4", "num_experts_per_tok=2", "moe_intermediate_size=32",
                       "n_group=2", "topk_group=1", "first_k_dense_replace=1"]),
    "gpt2": ("gpt2", ["n_layer=2", "n_embd=64", "n_head=4", "vocab_size=256", "n_positions=128"]),
    "bert": ("bert-base", SMALL[:3] + SMALL[5:]),
    "vit": ("vit-base", SMALL[:3] + ["intermediate_size=128", "image_size=32", "patch_size=8"]),
}
# transformers 5.x runs a mixture's experts as grouped matmuls over 3-D parameters (integrations/moe.py
# grouped_mm_experts_forward), which the hf recipe (4.46's per-expert loop) takes with moe.experts=grouped-mm.
# Before it was modelled, Mixtral's backward here was 2.3% apart, and 16% at sequence 256 under amp-bf16
# (test_grouped_experts_match_catalog).
GROUPED = ["--set", "moe.experts=grouped-mm"]


def test_families_cover_the_catalog():
    types = set()
    for n in hf.catalog_names():
        with open(os.path.join(REPO, "models", "catalog", n + ".json")) as f:
            types.add(json.load(f)["model_type"])
    assert types == set(FAMILIES), types ^ set(FAMILIES)


@needs_hf
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_trace_matches_catalog(tmp_path, family, memplan_bin):
    """export-hf's trace and memplan's catalog path (--recipe hf, CPU kernels) agree on every phase's peak
    within 2% for each catalog family (the causes of the gaps this found are in models/build: NewGELU's eager
    ops, torch.cat rotary layouts, Gemma2's eager attention, SDPA's CPU math path under dropout)."""
    if memplan_bin is None:
        pytest.skip("needs Go to build memplan")
    name, ov = FAMILIES[family]
    cfg = load_config(os.path.join(REPO, "models", "catalog", name + ".json"), ov)
    cp = tmp_path / "config.json"
    cp.write_text(json.dumps(cfg))
    out = str(tmp_path / "trace.json")
    doc = export_hf(str(cp), out, S, batch=B, precision="fp32", fit_seq=False)
    assert doc["execution"] == "fake"
    # transformers 5.x hands grouped heads to SDPA without a copy when there is no attention mask (enable_gqa,
    # integrations/sdpa_attention.py use_gqa_in_sdpa @v5.24.0); the hf recipe follows 4.46's repeat_kv
    cat = _plan(memplan_bin, "--model", str(cp), "--seq", str(S), "--precision", "fp32", "--recipe", "hf",
                "--set", "attention.repeat-kv=false", *GROUPED)
    gr = _plan(memplan_bin, "--graph", out)
    assert cat["params"] == gr["params"] == doc["n_params"], (cat["params"], gr["params"], doc["n_params"])
    for p in ("forward", "backward", "optimizer"):
        c, t = cat["phases"][p]["peak_bytes"], gr["phases"][p]["peak_bytes"]
        assert abs(c - t) / t <= 0.02, (family, p, c, t, "%+.2f%%" % (100 * (c - t) / t))


@needs_hf
@pytest.mark.parametrize("family,precision", [("mixtral", "fp32"), ("mixtral", "amp-bf16"), ("qwen3_moe", "fp32"),
                                              ("qwen3_moe", "amp-bf16"), ("deepseek_v3", "fp32")])
def test_grouped_experts_match_catalog(tmp_path, family, precision, memplan_bin):
    """transformers 5.x's experts (3-D gate_up_proj and down_proj, grouped_mm_experts_forward: sorted rows, two
    grouped matmuls, the routing weights applied before the inverse permutation) against --set
    moe.experts=grouped-mm, at a length where the experts' activations dominate (models/build groupedExperts).
    Measured at transformers 5.24.0, torch 2.14.1, sequence 256: within 0.4% on every phase, where the per-expert
    loop is 16% under on Mixtral's amp-bf16 forward (5.x runs the experts in float32 under autocast: grouped_mm
    has no autocast rule). DeepSeek's trace runs SDPA on ATen's CPU math path (its value head dim differs from the
    query's: float32 copies of q, k, v, the scores and _safe_softmax), which --attention eager matches in fp32; under
    amp-bf16 that path's float32 upcast is a CPU artifact memplan does not model, so DeepSeek is checked in fp32."""
    if memplan_bin is None:
        pytest.skip("needs Go to build memplan")
    name, ov = FAMILIES[family]
    seq = 256
    cfg = load_config(os.path.join(REPO, "models", "catalog", name + ".json"), ov)
    cp = tmp_path / "config.json"
    cp.write_text(json.dumps(cfg))
    out = str(tmp_path / "trace.json")
    doc = export_hf(str(cp), out, seq, batch=B, precision=precision, fit_seq=False)
    extra = ["--attention", "eager"] if family.startswith("deepseek") else []
    cat = _plan(memplan_bin, "--model", str(cp), "--seq", str(seq), "--precision", precision, "--recipe", "hf",
                "--set", "attention.repeat-kv=false", *GROUPED, *extra)
    gr = _plan(memplan_bin, "--graph", out)
    assert cat["params"] == gr["params"] == doc["n_params"], (cat["params"], gr["params"], doc["n_params"])
    for p in ("forward", "backward", "optimizer"):
        c, t = cat["phases"][p]["peak_bytes"], gr["phases"][p]["peak_bytes"]
        assert abs(c - t) / t <= 0.01, (family, precision, p, c, t, "%+.2f%%" % (100 * (c - t) / t))


@needs_hf
@pytest.mark.parametrize("family,precision,seq", [("falcon", "fp32", 256), ("falcon", "amp-bf16", 256),
                                                  ("falcon", "pure-bf16", 256), ("deepseek_v2", "fp32", 128)])
def test_eager_attention_matches_catalog(tmp_path, family, precision, seq, memplan_bin):
    """attn_implementation="eager" against --attention eager, at a length where the score matrices dominate:
    Falcon's eager path (models/build/falcon.go falconEager: three score matrices at the softmax, the fused
    projection and the attention's locals held until forward returns, eager_mask's float mask until the model's
    forward returns; each was 1.5-19% of the forward peak before it was modelled) and DeepSeek's latent attention
    (whose eager region --checkpoint selective recomputes). Measured at transformers 5.24.0, torch 2.14.1: within
    0.8% on every phase."""
    if memplan_bin is None:
        pytest.skip("needs Go to build memplan")
    name, ov = FAMILIES[family]
    cfg = load_config(os.path.join(REPO, "models", "catalog", name + ".json"), ov + ["attn_implementation=eager"])
    cp = tmp_path / "config.json"
    cp.write_text(json.dumps(cfg))
    out = str(tmp_path / "trace.json")
    doc = export_hf(str(cp), out, seq, batch=B, precision=precision, fit_seq=False)
    assert any("attn_implementation=eager" in n for n in doc["notes"]), doc["notes"]
    cat = _plan(memplan_bin, "--model", str(cp), "--seq", str(seq), "--precision", precision, "--recipe", "hf",
                "--set", "attention.repeat-kv=false", "--attention", "eager")
    gr = _plan(memplan_bin, "--graph", out)
    for p in ("forward", "backward", "optimizer"):
        c, t = cat["phases"][p]["peak_bytes"], gr["phases"][p]["peak_bytes"]
        assert abs(c - t) / t <= 0.01, (family, precision, p, c, t, "%+.2f%%" % (100 * (c - t) / t))


@needs_hf
@pytest.mark.parametrize("precision", ["fp32", "amp-bf16"])
def test_grouped_experts_lora_match_catalog(tmp_path, precision, memplan_bin):
    """peft all-linear over transformers 5.x's Mixtral: the experts (3-D parameters) and the router (a parameter
    applied with F.linear) are not nn.Linear, so peft adapts neither; --lora r=8,targets=all-linear with --set
    moe.experts=grouped-mm holds exactly the trace's parameters and is within 0.8% on every phase (transformers
    5.24.0, peft 0.18, torch 2.14.1, sequence 256), where the loop adapts every expert and the router (+31% forward,
    +64% optimizer in fp32)."""
    if memplan_bin is None:
        pytest.skip("needs Go to build memplan")
    name, ov = FAMILIES["mixtral"]
    seq, spec = 256, "r=8,alpha=16,targets=all-linear"
    cfg = load_config(os.path.join(REPO, "models", "catalog", name + ".json"), ov)
    cp = tmp_path / "config.json"
    cp.write_text(json.dumps(cfg))
    out = str(tmp_path / "trace.json")
    doc = export_hf(str(cp), out, seq, batch=B, precision=precision, fit_seq=False, lora=hf.parse_lora(spec))
    cat = _plan(memplan_bin, "--model", str(cp), "--seq", str(seq), "--precision", precision, "--recipe", "hf",
                "--set", "attention.repeat-kv=false", *GROUPED, "--lora", spec)
    gr = _plan(memplan_bin, "--graph", out)
    assert cat["params"] == gr["params"] == doc["n_params"], (cat["params"], gr["params"], doc["n_params"])
    for p in ("forward", "backward", "optimizer"):
        c, t = cat["phases"][p]["peak_bytes"], gr["phases"][p]["peak_bytes"]
        assert abs(c - t) / t <= 0.01, (precision, p, c, t, "%+.2f%%" % (100 * (c - t) / t))


def _cli(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    return subprocess.run([sys.executable, "-m", "memplan_torch", "export-hf"] + list(args), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path))


def test_resolve_catalog_names():
    assert hf.resolve_model("Llama-3-8B").endswith(os.path.join("catalog", "llama-3-8b.json"))
    assert hf.resolve_model("meta-llama/Meta-Llama-3-8B").endswith(os.path.join("catalog", "llama-3-8b.json"))
    assert hf.suggest("llama3-8b") == ["llama-3-8b", "llama-2-7b", "llama-3-70b"]  # as memplan plan suggests
    assert hf.suggest("mistral")[0] == "mistral-7b"


@pytest.mark.parametrize("args,want", [
    (["llama3-8b", "--seq", "16"], "closest: llama-3-8b, llama-2-7b, llama-3-70b"),
    (["no/such-model", "--seq", "16"], "neither a config file nor one of the configs memplan ships"),
    (["missing.json", "--seq", "16"], "cannot read config missing.json"),
    (["llama-3.2-1b", "--seq", "16", "--precision", "bf16"], "is not a Trainer mode"),
    (["llama-3.2-1b", "--seq", "16", "--precision", "fp8"], "--precision fp8 is not one of"),
    (["llama-3.2-1b", "--seq", "16", "--gradient-checkpointing", "sometimes"],
     "--gradient-checkpointing sometimes is not one of non-reentrant, reentrant"),
    (["llama-3.2-1b", "--seq", "16", "--lora", "r=x"], "--lora r=x: r=x is not a number"),
    (["llama-3.2-1b", "--seq", "16", "--lora", "rank=8"], "unknown key 'rank'"),
    (["llama-3.2-1b"], "--seq (tokens per sequence) is needed"),
    (["gpt2", "--seq", "4096"], "longer than gpt2.json's 1024 learned positions"),
    (["llama-3.2-1b", "--seq", "16", "--override", "hidden_size"], "--override wants KEY=VALUE"),
    # size fields: whole numbers in bounds (a zero-layer trace, or one of 100,000 layers, is not a model)
    (["gpt2", "--seq", "16", "--override", "n_layer=-1"], "--override n_layer=-1: the number of layers must be"),
    (["gpt2", "--seq", "16", "--override", "n_layer=0"], "--override n_layer=0: the number of layers must be"),
    (["gpt2", "--seq", "16", "--override", "n_layer=100000"], "--override n_layer=100000: the number of layers"),
    (["gpt2", "--seq", "16", "--override", "n_layer=2.5"], "--override n_layer=2.5: the number of layers"),
    (["gpt2", "--seq", "16", "--override", "n_layer=true"], "--override n_layer=true: the number of layers"),
    (["gpt2", "--seq", "16", "--override", "n_head=0"], "--override n_head=0: the number of attention heads"),
    (["gpt2", "--seq", "16", "--override", "n_embd=-8"], "--override n_embd=-8: the hidden size must be"),
    (["llama-3.2-1b", "--seq", "16", "--override", "num_attention_heads=0"], "--override num_attention_heads=0"),
    (["llama-3.2-1b", "--seq", "16", "--override", "hidden_size=0"], "--override hidden_size=0"),
    (["llama-3.2-1b", "--seq", "16", "--override", "vocab_size=-1"], "--override vocab_size=-1"),
    (["mixtral-8x7b", "--seq", "16", "--override", "num_local_experts=2000"],
     "32 layers × (1 + 2000 experts) = 64032 blocks, over the limit of 32768"),
    (["mixtral-8x7b", "--seq", "16", "--override", "num_experts_per_tok=9"], "--override num_experts_per_tok=9"),
])
def test_bad_input_one_line(tmp_path, args, want):
    if not transformers_available() and "is not a Trainer mode" not in want:
        pytest.skip("transformers is not installed")
    r = _cli(tmp_path, *(args + ["--out", "t.json"]))
    err = r.stderr.decode().strip()
    assert r.returncode != 0 and err.count("\n") == 0 and want in err, err
    assert "Traceback" not in err and not os.path.exists(tmp_path / "t.json")


@needs_hf
def test_fake_failure_names_op_module_and_real_fallback(tmp_path, monkeypatch):
    """A model that reads a value in forward cannot run under fake tensors: the error names the op and the
    module and offers --real; --real exports it."""
    orig = hf.build_model

    def build(cfg, precision, gc=None, lora=None):
        m, ac = orig(cfg, precision, gc, lora)
        norm = m.model.norm
        f = norm.forward

        def forward(x):
            if x.abs().max().item() < 0:  # a value read: no meta answer
                x = x + 1
            return f(x)
        norm.forward = forward
        return m, ac
    monkeypatch.setattr(hf, "build_model", build)
    cp = tmp_path / "tiny.json"
    cp.write_text(json.dumps(TINY))
    out = tmp_path / "t.json"
    with pytest.raises(ExportError) as e:
        export_hf(str(cp), str(out), 8, batch=1, precision="fp32", fit_seq=False)
    msg = str(e.value)
    assert "rerun export-hf with --real" in msg and "model.norm" in msg and "aten." in msg, msg
    assert not out.exists()
    doc = export_hf(str(cp), str(out), 8, batch=1, precision="fp32", fit_seq=False, real=True)
    assert doc["execution"] != "fake" and out.exists()


@needs_hf
@pytest.mark.parametrize("mode", ["non-reentrant", "reentrant"])
def test_gradient_checkpointing_matches_catalog(tmp_path, mode, memplan_bin):
    """After gradient_checkpointing_enable() each layer keeps only its input (the recompute runs inside
    backward, as traced); the catalog's --checkpoint full predicts the same peaks within 2%."""
    cp = tmp_path / "tiny.json"
    cp.write_text(json.dumps(TINY))
    out = str(tmp_path / "t.json")
    doc = export_hf(str(cp), out, S, batch=B, precision="fp32", fit_seq=False, gradient_checkpointing=mode)
    assert doc["execution"] == "fake"
    if memplan_bin is None:
        return
    gr = _plan(memplan_bin, "--graph", out)
    assert gr["saved_activations"]["by_module"]["model.layers.0"] == B * S * 64 * 4
    cat = _plan(memplan_bin, "--model", str(cp), "--seq", str(S), "--precision", "fp32", "--recipe", "hf",
                "--set", "attention.repeat-kv=false", "--checkpoint", "full")
    for p in ("forward", "backward", "optimizer"):
        c, t = cat["phases"][p]["peak_bytes"], gr["phases"][p]["peak_bytes"]
        assert abs(c - t) / t <= 0.02, (mode, p, c, t)
