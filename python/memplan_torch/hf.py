"""export-hf: a Hugging Face transformers causal LM built from its config.json, traced under fake tensors.

The model is made with ``AutoModelForCausalLM.from_config`` (random weights, attn_implementation="sdpa"):
no checkpoint is downloaded and nothing is read from the network (HF_HUB_OFFLINE is set while it is built).
One step is what transformers' Trainer runs: ``model(input_ids=..., labels=...).loss`` (the loss is computed
inside the model, under autocast for amp), ``loss.backward()``, ``torch.optim.AdamW.step()``,
``zero_grad(set_to_none=True)``; ``model.config.use_cache`` is False, as Trainer sets it (TrainingArguments
.use_cache defaults to False). Labels are the input ids (a causal-LM collator's copy); no attention_mask is
passed (no padding).

Precisions are named as ``memplan plan --precision`` names them:

* fp32: float32 parameters, no autocast;
* amp-bf16: float32 parameters, forward and loss under ``torch.autocast(bfloat16)``;
* pure-bf16: ``model.to(bfloat16)``, no autocast.

The fake tensors are cpu tensors, so amp-bf16 runs under cpu autocast, whose op lists differ a little from
cuda's (for a Llama, where every fp32 op is explicit in the model, the dtypes match).
"""

import contextlib
import json
import os

import torch

from . import compat, harness
from .export import build_trace, write_json
from .trace import ExportError

PRECISIONS = ("fp32", "amp-bf16", "pure-bf16")


def transformers_available():
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def load_config(path, overrides=()):
    """The config.json at `path` as a dict, with KEY=VALUE overrides (values parsed as JSON, else strings).
    When hidden_size or num_attention_heads is overridden and the config's head_dim was hidden_size /
    num_attention_heads, head_dim follows them (unless it is overridden too). Token ids outside an overridden
    vocabulary are dropped (set to None)."""
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ExportError("memplan_torch: cannot read config %s: %s" % (path, e))
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise ExportError("memplan_torch: %s is not a transformers config.json (no model_type)" % path)
    ov = {}
    for o in overrides or ():
        if "=" not in o:
            raise ExportError("memplan_torch: --override wants KEY=VALUE, got %r" % o)
        k, v = o.split("=", 1)
        ov[k.strip()] = _value(v.strip())
    old = dict(cfg)
    cfg.update(ov)
    if "head_dim" in old and "head_dim" not in ov and ("hidden_size" in ov or "num_attention_heads" in ov):
        h, n = old.get("hidden_size"), old.get("num_attention_heads")
        if h and n and old["head_dim"] == h // n:
            cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    if "vocab_size" in ov:
        v = cfg["vocab_size"]
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            t = cfg.get(k)
            ids = t if isinstance(t, list) else [t]
            if any(isinstance(i, int) and not 0 <= i < v for i in ids):
                cfg[k] = None
    return cfg


def _make_config(cfg):
    from transformers import CONFIG_MAPPING
    mt = cfg["model_type"]
    if mt not in CONFIG_MAPPING:
        raise ExportError("memplan_torch: transformers %s does not know model_type %r"
                          % (_tf_version(), mt))
    c = CONFIG_MAPPING[mt].from_dict(dict(cfg))
    c.use_cache = False  # what Trainer sets (TrainingArguments.use_cache, default False)
    return c


def _tf_version():
    import transformers
    return transformers.__version__


class HFJob(harness.Job):
    """A Trainer step: the model computes its own loss from labels; amp runs forward and loss under
    autocast (Trainer's compute_loss_context_manager), backward outside it."""

    def __init__(self, model, inputs, autocast_dtype=None):
        super().__init__(model, inputs, loss_fn=_hf_loss)
        self.autocast_dtype = autocast_dtype

    def forward(self, inputs=None):
        if self.autocast_dtype is None:
            return super().forward(inputs)
        with torch.autocast("cpu", dtype=self.autocast_dtype):
            return super().forward(inputs)


def _hf_loss(out):
    return out.loss


def build_model(cfg, precision):
    """(model, autocast dtype or None) for a config dict; random weights, train mode."""
    from transformers import AutoModelForCausalLM
    c = _make_config(cfg)
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        m = AutoModelForCausalLM.from_config(c, attn_implementation="sdpa", dtype=torch.float32)
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old
    if precision == "pure-bf16":
        m.to(torch.bfloat16)
    m.train()
    return m, (torch.bfloat16 if precision == "amp-bf16" else None)


@contextlib.contextmanager
def real_mask_decisions():
    """Makes transformers decide the attention mask as it does on real tensors.

    transformers treats FakeTensors as tracing (utils.is_tracing): it cannot read their values, so
    masking_utils.find_packed_sequence_indices returns the position ids' packed-sequence mask instead of
    checking that there is one sequence per row, and the mask code then builds a [B, 1, S, S] causal mask
    as for padded input. With a mask, sdpa_attention_forward also gives up `enable_gqa` and copies the
    key/value heads (repeat_kv). Run for real, the same step finds no packing (the model's own position ids
    are arange(S) in every row: this exporter never passes position_ids), passes no mask, uses
    is_causal=True and, for grouped-query attention, enable_gqa=True. This patch returns that answer, None,
    for fake position ids, and only for them; it is undone on exit."""
    try:
        import transformers.masking_utils as mu
    except ImportError:  # pragma: no cover
        yield
        return
    orig = getattr(mu, "find_packed_sequence_indices", None)
    if orig is None:  # pragma: no cover (another transformers version)
        yield
        return

    def find_packed_sequence_indices(position_ids, *a, **kw):
        if compat.is_fake(position_ids):
            return None
        return orig(position_ids, *a, **kw)

    mu.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = orig


def export_hf(config_path, path, seq, batch=2, precision="fp32", overrides=(), foreach=True, fit_seq=True,
              name=None):
    """Traces one Trainer step of the causal LM built from `config_path` (with `overrides`) at `batch` x
    `seq` tokens under fake tensors and writes a memplan.trace/v1 file to `path`. foreach=True is what
    Trainer's AdamW runs on cuda parameters (torch picks foreach there; on cpu it would not). Sizes are fitted in the
    batch and, with fit_seq, in the sequence (seq_dim 1). Returns the document."""
    if not compat.fake_tensors_available():
        raise ExportError("memplan_torch: export-hf needs PyTorch 2.x (fake tensors); this is torch %s"
                          % compat.TORCH_VERSION)
    if not transformers_available():
        raise ExportError("memplan_torch: export-hf needs the transformers package (python/requirements-torch2.txt "
                          "pins it)")
    if precision not in PRECISIONS:
        raise ExportError("memplan_torch: --precision %s is not one of %s" % (precision, ", ".join(PRECISIONS)))
    cfg = load_config(config_path, overrides)
    vocab = int(cfg.get("vocab_size") or 0)
    if vocab <= 0:
        raise ExportError("memplan_torch: %s has no vocab_size" % config_path)

    def make_job(b, s):
        torch.manual_seed(0)
        model, ac = build_model(cfg, precision)
        ids = torch.randint(0, vocab, (b, s or seq))
        return HFJob(model, {"input_ids": ids, "labels": ids.clone()}, ac)

    def make_fake_job(b, s, fm):
        try:
            with fm:
                job = make_job(b, s)
            note = None
        except Exception as e:  # an initializer that reads values: build it for real, then convert
            job = make_job(b, s)
            note = ("the model failed to build under fake tensors (%s: %s); it was built for real and its "
                    "tensors were converted to fake ones" % (type(e).__name__, (str(e).splitlines() or [""])[0][:200]))
        return harness.to_fake(job, fm), note

    with real_mask_decisions():
        doc = build_trace(make_job, batch, seq, "adamw", "cpu", foreach, 0, 1 if fit_seq else None,
                          name=name or "%s (%s)" % (cfg.get("_name_or_path") or os.path.basename(config_path),
                                                    precision),
                          source="transformers %s AutoModelForCausalLM.from_config(%s)" % (_tf_version(),
                                                                                         config_path),
                          make_fake_job=make_fake_job)
    doc["notes"].append("transformers %s %s built from %s%s, attn_implementation=sdpa, precision %s, Trainer "
                        "step (loss from labels inside the model, use_cache=False, AdamW)"
                        % (_tf_version(), (cfg.get("architectures") or [cfg["model_type"]])[0], config_path,
                           " with " + ", ".join(overrides) if overrides else "", precision))
    write_json(doc, path)
    return doc
