"""export-hf: a Hugging Face transformers model built from its config.json, traced under fake tensors.

    python3 -m memplan_torch export-hf MODEL_OR_CONFIG --seq S [--batch B] [--precision P]
                                      [--gradient-checkpointing [non-reentrant|reentrant]] [--lora SPEC] [--real]

MODEL_OR_CONFIG is a config.json or the name of one of the configs that ship with memplan (models/catalog:
the names `memplan models` lists, or their Hugging Face repository ids). The model is made with
``AutoModelFor*.from_config`` (random weights, transformers' default attention implementation: sdpa where
the family supports it, eager where it does not): no checkpoint is downloaded and nothing is read from the
network (HF_HUB_OFFLINE is set while it is built). Causal LMs get ``AutoModelForCausalLM``, BERT
``AutoModelForSequenceClassification`` and ViT ``AutoModelForImageClassification`` (the heads memplan's catalog
builds for them).

One step is what transformers' Trainer runs: ``model(**inputs).loss`` (the loss is computed inside the model
from ``labels``, under autocast for amp), ``loss.backward()``, ``torch.optim.AdamW.step()``,
``zero_grad(set_to_none=True)``; ``model.config.use_cache`` is False, as Trainer sets it
(TrainingArguments.use_cache defaults to False). Labels of a causal LM are the input ids (a causal-LM
collator's copy); no attention_mask is passed (no padding). ``--gradient-checkpointing`` calls
``gradient_checkpointing_enable`` as Trainer does (its use_reentrant default is False in transformers 5.x:
modeling_utils.py @v5.24.0 _activation_checkpointing_enable).

Precisions are named as ``memplan plan --precision`` names them, with its default, amp-bf16:

* fp32: float32 parameters, no autocast;
* amp-bf16 / amp-fp16: float32 parameters, forward and loss under ``torch.autocast`` (Trainer's --bf16 /
  --fp16; fp16's GradScaler only scales the scalar loss and unscales gradients in place);
* pure-bf16 / pure-fp16: ``model.to(bfloat16 / float16)``, no autocast.

bf16 and fp16 (16-bit weights with float32 master weights in the optimizer: DeepSpeed, Megatron) are not
something the Trainer does; they are refused with that said. The fake tensors are cpu tensors, so amp runs
under cpu autocast, whose op lists differ a little from cuda's (for a Llama, where every fp32 op is explicit
in the model, the dtypes match).
"""

import contextlib
import json
import os
import re

import torch

from . import compat, harness
from .export import build_trace, write_json
from .trace import ExportError, answered_reads

PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "pure-bf16", "pure-fp16")
PLAN_PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "bf16", "fp16", "pure-bf16", "pure-fp16")  # memplan plan's
DEFAULT_PRECISION = "amp-bf16"  # memplan plan's --precision default
CHECKPOINTING = ("non-reentrant", "reentrant")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CATALOG = os.path.join(REPO, "models", "catalog")


def catalog_names():
    """The names of the configs that ship with memplan (models/catalog/NAME.json), sorted."""
    try:
        return sorted(f[:-5] for f in os.listdir(CATALOG) if f.endswith(".json"))
    except OSError:
        return []


def catalog_repos():
    """{Hugging Face repository id (lower case): catalog name}, from models/catalog.go's catalogRepos, the
    one list of where each catalog config comes from."""
    try:
        with open(os.path.join(REPO, "models", "catalog.go")) as f:
            src = f.read()
    except OSError:
        return {}
    m = re.search(r"var catalogRepos = map\[string\]string\{(.*?)\n\}", src, re.S)
    if not m:
        return {}
    return {repo.lower(): name for name, repo in re.findall(r'"([^"]+)":\s*"([^"]+)"', m.group(1))}


def _levenshtein(a, b):
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def suggest(name, n=3):
    """Up to n catalog names closest to `name`, as models.Suggest ranks them (Levenshtein distance to the whole
    name or, if smaller, one more than to its prefix of the same length; ties in name order)."""
    key = name.strip().lower()
    cands = []
    for c in catalog_names():
        d = _levenshtein(key, c)
        if 0 < len(key) < len(c):
            d = min(d, _levenshtein(key, c[:len(key)]) + 1)
        cands.append((d, c))
    return [c for _, c in sorted(cands)[:n]]


def resolve_model(arg):
    """The config.json path for a config file or a catalog name (or its Hugging Face repository id)."""
    if os.path.isfile(arg) or arg.lower().endswith(".json"):
        return arg
    key = arg.strip().lower()
    names = catalog_names()
    if key in names:
        return os.path.join(CATALOG, key + ".json")
    repo = catalog_repos().get(key)
    if repo in names:
        return os.path.join(CATALOG, repo + ".json")
    raise ExportError("memplan_torch: %r is neither a config file nor one of the configs memplan ships "
                      "(models/catalog, no download); closest: %s" % (arg, ", ".join(suggest(arg))))


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


# Size fields of a config (transformers' names across the families memplan ships), each a whole number from 1 to
# its bound. export-hf traces small models on cpu under fake tensors: a trace's events grow with the layers (and
# the experts a step loops over: about 0.6 s of tracing per gpt2 layer), so the bounds keep an export from running
# away while leaving every real model in: 256 layers (the deepest memplan ships has 80; Llama 3.1 405B 126),
# layers x (1 + experts) at most 2^15 blocks (memplan plan's engine.MaxBlocks: DeepSeek-V3 is 61 x 257), widths
# far past any model's. None is kept where transformers derives the field (gpt2's n_inner, head_dim, ...).
MAX_LAYERS, MAX_BLOCKS = 256, 1 << 15
SIZE_BOUNDS = [
    (("num_hidden_layers", "n_layer", "num_layers", "n_layers"), "the number of layers", MAX_LAYERS, False),
    (("num_attention_heads", "n_head", "num_heads"), "the number of attention heads", 1024, False),
    (("num_key_value_heads",), "the number of key/value heads", 1024, True),
    (("hidden_size", "n_embd", "d_model"), "the hidden size", 1 << 18, False),
    (("intermediate_size", "n_inner", "moe_intermediate_size", "head_dim"), "a width", 1 << 18, True),
    (("vocab_size",), "the vocabulary size", 1 << 20, False),
    (("max_position_embeddings", "n_positions", "n_ctx"), "the number of positions", 1 << 24, True),
    (("num_local_experts", "num_experts", "n_routed_experts"), "the number of experts", MAX_BLOCKS, True),
    (("image_size", "patch_size", "num_channels"), "an image size", 1 << 16, True),
]
EXPERT_KEYS = SIZE_BOUNDS[7][0]


def _is_whole(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_sizes(cfg, path, ov=None):
    """Refuses (ExportError) a config whose size fields are not whole numbers within SIZE_BOUNDS, whose
    experts per token exceed its experts, or whose layers x (1 + experts) pass MAX_BLOCKS; the message names
    the --override that set the field, else the config file."""
    ov = ov or {}

    def where(k):
        if k in ov:
            return "--override %s=%s" % (k, ov[k][1])
        return "%s: %s %s" % (path, k, json.dumps(cfg[k]))

    def bad(k, what, hi):
        raise ExportError("memplan_torch: %s: %s must be a whole number from 1 to %d (export-hf traces small "
                          "models; see export-hf --help)" % (where(k), what, hi))

    for keys, what, hi, none_ok in SIZE_BOUNDS:
        for k in keys:
            if k not in cfg or (cfg[k] is None and none_ok):
                continue
            v = cfg[k]
            if not _is_whole(v) or not 1 <= v <= hi:
                bad(k, what, hi)
    experts = max([cfg[k] for k in EXPERT_KEYS if _is_whole(cfg.get(k))] or [0])
    k = "num_experts_per_tok"
    if k in cfg and cfg[k] is not None and experts:
        if not _is_whole(cfg[k]) or not 1 <= cfg[k] <= experts:
            raise ExportError("memplan_torch: %s: the experts per token must be a whole number from 1 to the %d "
                              "experts" % (where(k), experts))
    lk = [k for k in SIZE_BOUNDS[0][0] if _is_whole(cfg.get(k))]
    if lk and experts:
        layers = max(cfg[k] for k in lk)
        if layers * (1 + experts) > MAX_BLOCKS:
            set_by = [k for k in lk + list(EXPERT_KEYS) if k in ov] or [k for k in lk + list(EXPERT_KEYS) if k in cfg]
            raise ExportError("memplan_torch: %s: %d layers × (1 + %d experts) = %d blocks, over the limit of %d "
                              "(as memplan plan's)" % (", ".join(where(k) for k in set_by), layers, experts,
                                                       layers * (1 + experts), MAX_BLOCKS))


def load_config(path, overrides=()):
    """The config.json at `path` as a dict, with KEY=VALUE overrides (values parsed as JSON, else strings);
    size fields out of SIZE_BOUNDS are refused (check_sizes), naming the override or the file.
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
        ov[k.strip()] = (_value(v.strip()), v.strip())
    old = dict(cfg)
    cfg.update((k, v) for k, (v, _) in ov.items())
    check_sizes(cfg, path, ov)
    if "head_dim" in old and "head_dim" not in ov and ("hidden_size" in ov or "num_attention_heads" in ov):
        h, n = old.get("hidden_size"), old.get("num_attention_heads")
        if h and n and old["head_dim"] == h // n:
            cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
            if cfg["head_dim"] < 1:
                raise ExportError("memplan_torch: --override: head_dim = hidden_size %d / num_attention_heads %d is "
                                  "0; give fewer heads or a larger hidden size" % (cfg["hidden_size"],
                                                                                  cfg["num_attention_heads"]))
    if "num_key_value_heads" in old and "num_key_value_heads" not in ov and "num_attention_heads" in ov \
            and old["num_key_value_heads"] == old.get("num_attention_heads"):
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]  # multi-head attention stays multi-head
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


TASKS = {"bert": "sequence-classification", "vit": "image-classification"}  # everything else: causal-lm


def task_of(cfg):
    return TASKS.get(cfg.get("model_type"), "causal-lm")


def _auto_class(task):
    import transformers
    return {"causal-lm": transformers.AutoModelForCausalLM,
            "sequence-classification": transformers.AutoModelForSequenceClassification,
            "image-classification": transformers.AutoModelForImageClassification}[task]


def _dtype(precision):
    return torch.bfloat16 if precision.endswith("bf16") else torch.float16 if precision.endswith("fp16") else None


def parse_lora(spec):
    """memplan plan's --lora SPEC (r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj; targets=all-linear) as
    peft.LoraConfig arguments; peft's defaults (r 8, alpha 8, dropout 0, the family's default targets) fill
    what it leaves out."""
    out, key = {}, None
    for part in spec.split(","):
        part = part.strip()
        if "=" in part:
            key, v = part.split("=", 1)
            key = key.strip()
            if key not in ("r", "alpha", "dropout", "targets"):
                raise ExportError("memplan_torch: --lora %s: unknown key %r (want r, alpha, dropout, targets)"
                                  % (spec, key))
            try:
                out[key] = [v] if key == "targets" else int(v) if key in ("r", "alpha") else float(v)
            except ValueError:
                raise ExportError("memplan_torch: --lora %s: %s=%s is not a number" % (spec, key, v))
        elif key == "targets" and part:
            out["targets"].append(part)
        elif part:
            raise ExportError("memplan_torch: --lora %s: %r is not KEY=VALUE" % (spec, part))
    kw = {"r": out.get("r", 8), "lora_alpha": out.get("alpha", out.get("r", 8)),
          "lora_dropout": out.get("dropout", 0.0)}
    if kw["r"] <= 0:
        raise ExportError("memplan_torch: --lora %s: r must be positive" % spec)
    t = out.get("targets")
    if t:
        kw["target_modules"] = "all-linear" if t == ["all-linear"] else t
    return kw


def build_model(cfg, precision, gradient_checkpointing=None, lora=None):
    """(model, autocast dtype or None) for a config dict; random weights, train mode. gradient_checkpointing
    is None, "non-reentrant" or "reentrant"; lora a peft.LoraConfig's arguments (parse_lora)."""
    c = _make_config(cfg)
    task = task_of(cfg)
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        # no attn_implementation: transformers' default, sdpa where the family supports it, else eager
        # (Gemma2: _supports_sdpa = False, soft-capping), as a Trainer user gets it
        m = _auto_class(task).from_config(c, dtype=torch.float32)
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old
    if precision.startswith("pure-"):
        m.to(_dtype(precision))
    if gradient_checkpointing:
        # what Trainer does for --gradient_checkpointing (trainer.py @v5.24.0): the model's own switch, with
        # gradient_checkpointing_kwargs passed through
        kw = {"use_reentrant": gradient_checkpointing == "reentrant"}
        if hasattr(m, "activation_checkpointing_enable"):
            m.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
        else:  # transformers 4.x
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    if lora is not None:
        try:
            import peft
        except ImportError:
            raise ExportError("memplan_torch: --lora needs the peft package (python/requirements-torch2.txt pins it)")
        kw = dict(lora)
        if task == "sequence-classification":
            kw["task_type"] = "SEQ_CLS"
        elif task == "causal-lm":
            kw["task_type"] = "CAUSAL_LM"
        m = peft.get_peft_model(m, peft.LoraConfig(**kw))
    m.train()
    return m, (_dtype(precision) if precision.startswith("amp-") else None)


def make_inputs(cfg, batch, seq):
    """The batch a Trainer hands the model: input_ids and labels (causal LM: a copy of the ids; BERT: one
    class per sequence, with token_type_ids), or pixel_values and labels (ViT)."""
    task = task_of(cfg)
    if task == "image-classification":
        n = int(cfg.get("image_size", 224))
        return {"pixel_values": torch.randn(batch, int(cfg.get("num_channels", 3)), n, n),
                "labels": torch.randint(0, _num_labels(cfg), (batch,))}
    ids = torch.randint(0, int(cfg["vocab_size"]), (batch, seq))
    if task == "sequence-classification":
        return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
                "labels": torch.randint(0, _num_labels(cfg), (batch,))}
    return {"input_ids": ids, "labels": ids.clone()}


def _num_labels(cfg):
    if cfg.get("id2label"):
        return len(cfg["id2label"])
    return int(cfg.get("num_labels", 2))


@contextlib.contextmanager
def grouped_mm_meta():
    """Lets aten._grouped_mm run under fake tensors in the dtypes the CPU kernel runs.

    transformers 5.x runs MoE experts with grouped_mm by default (integrations/moe.py @v5.24.0:
    get_correct_experts_implementation picks "grouped_mm", _can_use_grouped_mm is true on cpu). The CPU kernel
    takes float32 (measured: a float32 Mixtral step runs aten._grouped_mm.default on torch 2.14.1), but the meta
    function refuses anything but bfloat16/float16 (torch/_meta_registrations.py _meta_grouped_mm_common), so
    a float32 or amp Mixtral fails under fake tensors where it runs for real. While this is entered, the meta
    function is one that checks nothing and returns the output the kernel returns: [rows, out] for a 2-D input
    and 3-D weight (the MoE case), [groups, rows, out] / [batch, rows, out] for the others."""
    try:
        lib = torch.library.Library("aten", "IMPL")
    except Exception:  # pragma: no cover
        yield
        return

    def meta(input, weight, offs=None, bias=None, out_dtype=None):
        dt = out_dtype or input.dtype
        if input.dim() == 2 and weight.dim() == 2:
            shape = (offs.shape[0], input.shape[0], weight.shape[-1])
        elif input.dim() == 2:
            shape = (input.shape[0], weight.shape[-1])
        else:
            shape = (input.shape[0], input.shape[1], weight.shape[-1])
        return input.new_empty(shape, dtype=dt)

    try:
        lib.impl("_grouped_mm", meta, "Meta", allow_override=True)
    except Exception:  # pragma: no cover (another torch: no _grouped_mm or no override)
        lib._destroy()
        yield
        return
    try:
        yield
    finally:
        lib._destroy()


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
    for fake position ids, and only for them, after running the check's ops on them as the real step does
    (the position diff, its cumsum, `(mask[:, -1] == 0).all()` and the read of that value, which
    trace.answered_reads answers True), so the fake trace records the real one's events; it is undone on exit."""
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
        if not compat.is_fake(position_ids):
            return orig(position_ids, *a, **kw)
        # transformers/masking_utils.py find_packed_sequence_indices @v5.24.0, with the real step's answer
        first_dummy_value = position_ids[:, :1] - 1
        position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
        packed_sequence_mask = (position_diff != 1).cumsum(-1)
        with answered_reads(True):
            one_sequence_per_row = bool((packed_sequence_mask[:, -1] == 0).all())
        assert one_sequence_per_row
        return None

    mu.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = orig


def export_hf(model, path, seq=None, batch=2, precision=DEFAULT_PRECISION, overrides=(), foreach=True, fit_seq=True,
              name=None, gradient_checkpointing=None, lora=None, real=False):
    """Traces one Trainer step of the model built from `model` (a config.json or a catalog name, with
    `overrides`) at `batch` x `seq` tokens under fake tensors (real=True: built and run for real on cpu) and
    writes a memplan.trace/v1 file to `path`. foreach=True is what Trainer's AdamW runs on cuda parameters
    (torch picks foreach there; on cpu it would not). Sizes are fitted in the batch and, with fit_seq, in the
    sequence (seq_dim 1; not for ViT, whose input is an image). gradient_checkpointing: None, "non-reentrant"
    or "reentrant"; lora: peft.LoraConfig arguments (parse_lora). Returns the document; nothing is written
    when it fails."""
    if precision in ("bf16", "fp16"):
        raise ExportError("memplan_torch: --precision %s (16-bit weights with float32 master weights in the "
                          "optimizer: DeepSpeed, Megatron) is not a Trainer mode; the Trainer's are amp-%s "
                          "(--%s) and pure-%s (the model loaded in that dtype)"
                          % (precision, precision, precision, precision))
    if precision not in PRECISIONS:
        raise ExportError("memplan_torch: --precision %s is not one of %s" % (precision, ", ".join(PRECISIONS)))
    if gradient_checkpointing not in (None,) + CHECKPOINTING:
        raise ExportError("memplan_torch: --gradient-checkpointing %s is not one of %s"
                          % (gradient_checkpointing, ", ".join(CHECKPOINTING)))
    if not real and not compat.fake_tensors_available():
        raise ExportError("memplan_torch: export-hf needs PyTorch 2.x (fake tensors); this is torch %s"
                          % compat.TORCH_VERSION)
    if not transformers_available():
        raise ExportError("memplan_torch: export-hf needs the transformers package (python/requirements-torch2.txt "
                          "pins it)")
    config_path = resolve_model(model)
    cfg = load_config(config_path, overrides)
    task = task_of(cfg)
    if task != "image-classification":
        if int(cfg.get("vocab_size") or 0) <= 0:
            raise ExportError("memplan_torch: %s has no vocab_size" % config_path)
        if seq is None or seq < 1:
            raise ExportError("memplan_torch: --seq (tokens per sequence) is needed for %s" % cfg["model_type"])
        mp = cfg.get("max_position_embeddings") or cfg.get("n_positions")
        if isinstance(mp, int) and seq > mp and cfg["model_type"] in ("bert", "gpt2"):
            raise ExportError("memplan_torch: --seq %d is longer than %s's %d learned positions"
                              % (seq, os.path.basename(config_path), mp))
    else:
        seq, fit_seq = None, False
    if batch < 1:
        raise ExportError("memplan_torch: --batch must be at least 1, got %d" % batch)
    if fit_seq and seq is not None and seq < 3:
        fit_seq = False

    built = {}

    def make_job(b, s):
        torch.manual_seed(0)
        model, ac = build_model(cfg, precision, gradient_checkpointing, lora)
        built["attn"] = getattr(getattr(model, "config", None), "_attn_implementation", None)
        return HFJob(model, make_inputs(cfg, b, s or seq), ac)

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

    what = "%s (%s%s%s)" % (cfg.get("_name_or_path") or os.path.basename(config_path)[:-5], precision,
                            ", %s gradient checkpointing" % gradient_checkpointing if gradient_checkpointing else "",
                            ", LoRA" if lora else "")
    try:
        with real_mask_decisions(), grouped_mm_meta():
            doc = build_trace(make_job, batch, seq, "adamw", "cpu", foreach, 0, 1 if fit_seq else None,
                              name=name or what,
                              source="transformers %s %s.from_config(%s)" % (
                                  _tf_version(), _auto_class(task).__name__, config_path),
                              make_fake_job=None if real else make_fake_job)
    except ExportError as e:
        msg = str(e)
        if not real and "--real" in msg:
            msg = re.sub(r";[^;]*--real.*$", "", msg) + "; rerun export-hf with --real to build the model and " \
                "run the step for real on cpu (slower, and it needs the model's memory)"
        raise ExportError(msg)
    doc["notes"].append("transformers %s %s built from %s%s, attn_implementation=%s, precision %s%s%s, Trainer "
                        "step (loss from labels inside the model, use_cache=False, AdamW)"
                        % (_tf_version(), (cfg.get("architectures") or [cfg["model_type"]])[0], config_path,
                           " with " + ", ".join(overrides) if overrides else "", built.get("attn"), precision,
                           ", gradient_checkpointing_enable(use_reentrant=%s)" % (gradient_checkpointing == "reentrant")
                           if gradient_checkpointing else "",
                           ", peft LoRA %s" % json.dumps(lora, sort_keys=True) if lora else ""))
    if "model_output" in doc:
        # the loop this trace is of: Trainer.compute_loss returns the loss only, so the outputs (the logits) are
        # dropped before backward (transformers src/transformers/trainer.py compute_loss, training_step; memplan's
        # hf recipe: loop.hold-outputs=false); `memplan plan --graph` plans this habit unless told another
        doc["model_output"]["hold"] = "none"
    write_json(doc, path)
    return doc


def trainer_builder(model, seq_len_default=64, precision="fp32", gradient_checkpointing=None, overrides=()):
    """A model builder (harness: FUNCTION(batch_size, seq_len=) -> (model, inputs, loss_fn)) for a catalog
    model or config with overrides: the same model and Trainer step export-hf traces, for the exporter's
    real path and the measurement (validation suite)."""
    cfg = load_config(resolve_model(model), overrides)
    if precision != "fp32" and not precision.startswith("pure-"):
        raise ExportError("memplan_torch: a builder runs no autocast; use export-hf for %s" % precision)

    def build(batch_size, seq_len=seq_len_default):
        m, _ = build_model(cfg, precision, gradient_checkpointing)
        return m, make_inputs(cfg, batch_size, seq_len), _hf_loss
    return build


# The validation suite's Hugging Face cases (suite.py): a 2-layer Llama (grouped-query attention) of the
# catalog's llama-3.2-1b structure, with transformers' gradient checkpointing either way. Sizes keep a real CPU
# step to a fraction of a second at batch 16.
SMALL_LLAMA = ("num_hidden_layers=2", "hidden_size=128", "num_attention_heads=4", "num_key_value_heads=2",
               "head_dim=32", "intermediate_size=256", "vocab_size=512")


def llama_gc(batch_size, seq_len=64):
    return trainer_builder("llama-3.2-1b", gradient_checkpointing="non-reentrant",
                           overrides=SMALL_LLAMA)(batch_size, seq_len)


def llama_gc_reentrant(batch_size, seq_len=64):
    return trainer_builder("llama-3.2-1b", gradient_checkpointing="reentrant",
                           overrides=SMALL_LLAMA)(batch_size, seq_len)


def llama_small(batch_size, seq_len=64):
    return trainer_builder("llama-3.2-1b", overrides=SMALL_LLAMA)(batch_size, seq_len)
