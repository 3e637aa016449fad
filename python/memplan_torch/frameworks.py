"""The framework suite: one training step of real frameworks, measured on CPU, against memplan's predictions.

    python3 -m memplan_torch.frameworks --out DIR [--memplan BIN] [--cases a,b] [--no-trace]

Each case runs ONE optimizer step of a framework on a tiny llama-style model (CONFIG) with the framework's own
model code and training loop, in a process under the LD_PRELOAD allocation tracker (tracker.py), and records
the peak of live tensor bytes in forward (with the loss), backward and the optimizer step, less what was live
before the model was built. The same job is then predicted by memplan's catalog path (`memplan plan --model
CONFIG.json --recipe R --precision P ...`, the first step's per-phase peaks) and, where the exporter can run the
step, by the trace path (a trace of the same model and loss, replayed at the measured batch). The suite prints
one table (case, framework, precision, measured, catalog, error, trace, error) and writes DIR/frameworks.json.

What runs, per framework (versions pinned in python/requirements-torch2.txt):

* hf: transformers' Trainer.train() with max_steps=1 on a LlamaForCausalLM built from CONFIG (sdpa), optionally
  wrapped by peft's get_peft_model(LoraConfig); bf16=True is accelerate's CPU autocast (amp-bf16), a model made
  with dtype=bfloat16 and no bf16 flag is pure-bf16. Phases are marked by hooks: the model's forward pre-hook
  and hook (the loss is computed inside the model from labels) and the global optimizer step pre/post hooks.
* litgpt: litgpt's GPT (or litgpt.lora.GPT) under Lightning Fabric (precision bf16-true or bf16-mixed), the
  step of litgpt/finetune/full.py and lora.py (fit loop): logits = model(input_ids[, lm_head_chunk_size=128]),
  chunked_cross_entropy, fabric.backward, optimizer.step, optimizer.zero_grad.
* torchtune: torchtune's llama3 / lora_llama3 component builders under training.set_default_dtype(bf16), the
  step of recipes/full_finetune_single_device.py and lora_finetune_single_device.py (_loss_step: chunked output,
  CEWithChunkedOutputLoss, del logits; backward; scale_grads; AdamW(fused=True).step; zero_grad(set_to_none)),
  and optimizer_in_bwd (training.register_optim_in_bwd_hooks: one optimizer per parameter, stepped in backward).

All cases run in one process under the tracker; the first case runs twice and its second run is measured,
because the process's first step pays for lazy initialisations that belong to no job (133,632 bytes in every phase
here). Each measured run is still a first step (a fresh model and optimizer), so memplan's first-step prediction is
the one compared.
"""

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

# the tiny llama-style model every case trains (a transformers config.json; litgpt's and torchtune's builders get
# the same shapes)
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
    "vocab_size": 1024, "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    "torch_dtype": "float32",
}
# transformers 5.x's cases (--recipe hf5) train from a checkpoint saved in bfloat16, with grouped heads (2 key/value
# heads for 4 query heads) and, for the mixture, Mixtral's experts (4, two routed a token)
CONFIGS = {
    "llama": CONFIG,
    "gqa": dict(CONFIG, num_key_value_heads=2, torch_dtype="bfloat16"),
    "moe": dict(CONFIG, architectures=["MixtralForCausalLM"], model_type="mixtral", num_key_value_heads=2,
                num_local_experts=4, num_experts_per_tok=2, torch_dtype="bfloat16", sliding_window=None,
                router_aux_loss_coef=0.0, output_router_logits=False),
}
BATCH, SEQ = 4, 128
LORA = dict(r=8, alpha=16, dropout=0.05, targets=("q_proj", "v_proj"))

# name, framework, precision (memplan's name), lora, optimizer in backward, checkpoint (every layer: Trainer's
# gradient_checkpointing; under autocast it shows the weight-cast cache held to the end of the forward)
CASES = [
    dict(name="hf-full-amp", framework="hf", precision="amp-bf16"),
    dict(name="hf-full-bf16", framework="hf", precision="pure-bf16"),
    dict(name="hf-full-amp-gc", framework="hf", precision="amp-bf16", checkpoint=True),
    dict(name="hf-lora-amp", framework="hf", precision="amp-bf16", lora=True),
    dict(name="hf-lora-bf16", framework="hf", precision="pure-bf16", lora=True),
    dict(name="litgpt-full-bf16", framework="litgpt", precision="pure-bf16"),
    dict(name="litgpt-full-amp", framework="litgpt", precision="amp-bf16"),
    dict(name="litgpt-lora-bf16", framework="litgpt", precision="pure-bf16", lora=True),
    dict(name="torchtune-full-bf16", framework="torchtune", precision="pure-bf16"),
    dict(name="torchtune-lora-bf16", framework="torchtune", precision="pure-bf16", lora=True),
    dict(name="torchtune-full-bf16-inbwd", framework="torchtune", precision="pure-bf16", in_backward=True),
    # transformers 5.x as it runs by default: from_pretrained of a bfloat16 checkpoint (dtype "auto"), bf16=True,
    # the default optim (adamw_torch_fused on PyTorch 2.8+), no padding (SDPA's enable_gqa), grouped_mm experts;
    # memplan is given no --precision: the recipe's precision=checkpoint reads config.json (autocast-bf16: bfloat16
    # parameters, autocast casting what is float32, peft's adapters and their inputs)
    dict(name="hf5-full-gqa", framework="hf5", precision="checkpoint", config="gqa"),
    dict(name="hf5-lora-gqa", framework="hf5", precision="checkpoint", config="gqa", lora=True),
    dict(name="hf5-full-moe", framework="hf5", precision="checkpoint", config="moe"),
    # the Trainer with neither bf16 nor fp16: the same parameters without autocast, memplan's pure-bf16
    dict(name="hf5-lora-gqa-noflag", framework="hf5", precision="pure-bf16", config="gqa", lora=True, flag=False),
]
PHASES = ("forward", "backward", "optimizer")
TOLERANCE = 0.03

# Differences beyond TOLERANCE that are understood, keyed by (case, path "catalog" or "trace"): dict(phases={phase:
# (low, high)}, why=...): the range each phase's error was in when it was explained (a point either side of the
# measurement, so a new gap cannot hide behind an old explanation) and the mechanism, with the source that shows
# it. Empty: every case is within TOLERANCE on both paths.
EXPLAINED = {}

# How long each framework's loop keeps the model's output (memplan's loop.hold-outputs), for the trace path's
# replay (the catalog path takes it from the recipe, which says the same)
HOLD = {
    "hf": "false",  # transformers trainer.py Trainer.training_step: compute_loss returns the loss only
    "litgpt": "true",  # litgpt/finetune/lora.py @v0.5.13 fit: logits = model(...) stays bound to the next forward
    "torchtune": "false",  # recipes/lora_finetune_single_device.py @v0.6.1 _loss_step: del logits before backward
}


class FrameworkError(RuntimeError):
    pass


def case_by_name(name):
    for c in CASES:
        if c["name"] == name:
            return c
    raise FrameworkError("memplan_torch.frameworks: unknown case %r (cases: %s)"
                         % (name, ", ".join(c["name"] for c in CASES)))


# ---------------------------------------------------------------------------------------------------------------
# phase marks


class Meter:
    """Per-phase peaks of the tracker's aligned live bytes (c10's CPU tensors), less a floor."""

    def __init__(self, counters):
        self.c = counters
        self.floor = 0
        self.phases = {}
        self.current = None

    def set_floor(self):
        gc.collect()
        self.floor = self.c.aligned_live()

    def begin(self, phase):
        self.c.reset_peak()
        self.current = phase

    def end(self, phase=None):
        phase = phase or self.current
        if phase is None:
            return
        v = self.c.aligned_peak() - self.floor
        self.phases[phase] = max(self.phases.get(phase, 0), v)
        self.current = None
        self.c.reset_peak()

    def live(self):
        return self.c.aligned_live() - self.floor


@contextlib.contextmanager
def optimizer_marks(meter):
    """Marks the optimizer phase around every torch.optim step (global hooks), ending backward first."""
    import torch.optim.optimizer as oo

    def pre(opt, args, kwargs):
        meter.end("backward")
        meter.begin("optimizer")

    def post(opt, args, kwargs):
        meter.end("optimizer")

    h1 = oo.register_optimizer_step_pre_hook(pre)
    h2 = oo.register_optimizer_step_post_hook(post)
    try:
        yield
    finally:
        h1.remove()
        h2.remove()


def _batch(vocab, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, SEQ), generator=g)


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face Trainer (+ peft)


def _hf_model(precision):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("architectures", "model_type")})
    cfg.use_cache = False
    dtype = torch.bfloat16 if precision == "pure-bf16" else torch.float32
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)


def _peft(case, model):
    if not case.get("lora"):
        return model
    from peft import LoraConfig, get_peft_model
    return get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                            target_modules=list(LORA["targets"]), task_type="CAUSAL_LM"))


def _train(model, meter, tmp, vocab, **training_args):
    """Trainer.train() for one step of BATCH sequences, its phases marked on the model Trainer calls (peft's
    LoraModel calls the wrapped model's .forward directly, past its hooks); the loss is computed inside the
    model (labels), so the forward hook ends the forward."""
    from transformers import Trainer, TrainingArguments
    ids = _batch(vocab)
    data = [{"input_ids": ids[i], "labels": ids[i].clone()} for i in range(BATCH)]
    args = TrainingArguments(output_dir=tmp, max_steps=1, per_device_train_batch_size=BATCH, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0, dataloader_pin_memory=False, seed=0, **training_args)
    trainer = Trainer(model=model, args=args, train_dataset=data)

    def post(m, a, o):
        meter.end("forward")
        meter.begin("backward")

    model.register_forward_pre_hook(lambda m, a: meter.begin("forward"))
    model.register_forward_hook(post)
    with optimizer_marks(meter):
        trainer.train()
    return args


def run_hf(case, meter, tmp):
    import torch
    torch.manual_seed(0)
    model = _peft(case, _hf_model(case["precision"]))
    _train(model, meter, tmp, CONFIG["vocab_size"], bf16=case["precision"] == "amp-bf16", optim="adamw_torch",
           gradient_checkpointing=bool(case.get("checkpoint")))
    return {"versions": _versions("transformers", "peft", "accelerate")}


# ---------------------------------------------------------------------------------------------------------------
# litgpt


def _litgpt_config(lora):
    kw = dict(name="memplan-tiny", block_size=SEQ, vocab_size=CONFIG["vocab_size"],
              padded_vocab_size=CONFIG["vocab_size"], n_layer=CONFIG["num_hidden_layers"],
              n_head=CONFIG["num_attention_heads"], n_query_groups=CONFIG["num_key_value_heads"],
              n_embd=CONFIG["hidden_size"], head_size=CONFIG["head_dim"], rotary_percentage=1.0,
              parallel_residual=False, bias=False, norm_class_name="RMSNorm", norm_eps=CONFIG["rms_norm_eps"],
              mlp_class_name="LLaMAMLP", intermediate_size=CONFIG["intermediate_size"],
              rope_base=int(CONFIG["rope_theta"]))
    if lora:
        from litgpt.lora import Config
        # finetune/lora.py's defaults: query and value adapted, key, projection, mlp and head not
        kw.update(lora_r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"], lora_query=True,
                  lora_key=False, lora_value=True, lora_projection=False, lora_mlp=False, lora_head=False)
        return Config(**kw)
    from litgpt import Config
    return Config(**kw)


def run_litgpt(case, meter, tmp):
    import lightning as L
    import torch
    from litgpt.utils import chunked_cross_entropy
    lora = bool(case.get("lora"))
    precision = {"pure-bf16": "bf16-true", "amp-bf16": "bf16-mixed"}[case["precision"]]
    fabric = L.Fabric(accelerator="cpu", devices=1, precision=precision)
    torch.manual_seed(0)
    cfg = _litgpt_config(lora)
    with fabric.init_module(empty_init=False):
        if lora:
            from litgpt.lora import GPT, mark_only_lora_as_trainable
            model = GPT(cfg)
            mark_only_lora_as_trainable(model)
        else:
            from litgpt import GPT
            model = GPT(cfg)
    model = fabric.setup_module(model)
    # instantiate_torch_optimizer("AdamW", ...) of litgpt/utils.py: torch.optim.AdamW with the CLI's kwargs
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.02,
                                                          betas=(0.9, 0.95)))
    ids = _batch(CONFIG["vocab_size"])
    input_ids, targets = ids, ids.clone()
    with optimizer_marks(meter):
        meter.begin("forward")
        if lora:  # finetune/lora.py fit()
            logits = model(input_ids, lm_head_chunk_size=128)
            logits[-1] = logits[-1][..., :-1, :]
            loss = chunked_cross_entropy(logits, targets[..., 1:])
        else:  # finetune/full.py fit()
            logits = model(input_ids)
            loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
        meter.end("forward")
        meter.begin("backward")
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    del logits, loss
    return {"versions": _versions("litgpt", "lightning")}


# ---------------------------------------------------------------------------------------------------------------
# torchtune


def _torchtune_llama(lora, dtype):
    """torchtune's Llama 3 of CONFIG's shape in dtype, with LoRA adapters (only they trainable) when lora; the
    measured run and the trace export build it the same way."""
    from torchtune import training
    kw = dict(vocab_size=CONFIG["vocab_size"], num_layers=CONFIG["num_hidden_layers"],
              num_heads=CONFIG["num_attention_heads"], num_kv_heads=CONFIG["num_key_value_heads"],
              embed_dim=CONFIG["hidden_size"], max_seq_len=SEQ, intermediate_dim=CONFIG["intermediate_size"],
              norm_eps=CONFIG["rms_norm_eps"], rope_base=CONFIG["rope_theta"])
    with training.set_default_dtype(dtype):
        if not lora:
            from torchtune.models.llama3._component_builders import llama3
            return llama3(**kw)
        from torchtune.models.llama3._component_builders import lora_llama3
        from torchtune.modules.peft import get_adapter_params, set_trainable_params
        model = lora_llama3(lora_attn_modules=list(LORA["targets"]), apply_lora_to_mlp=False,
                            apply_lora_to_output=False, lora_rank=LORA["r"], lora_alpha=LORA["alpha"],
                            lora_dropout=0.0, **kw)
        set_trainable_params(model, get_adapter_params(model))
        return model


def run_torchtune(case, meter, tmp):
    import torch
    from torchtune import training
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    lora = bool(case.get("lora"))
    in_bwd = bool(case.get("in_backward"))
    dtype = {"pure-bf16": torch.bfloat16}[case["precision"]]
    torch.manual_seed(0)
    model = _torchtune_llama(lora, dtype)
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    ignore_labels_cache = torch.full((BATCH, 1), loss_fn.ignore_index)
    if in_bwd:
        optim_dict = {p: torch.optim.AdamW([p], lr=2e-5, fused=True) for p in model.parameters()}
        training.register_optim_in_bwd_hooks(model=model, optim_dict=optim_dict)
        optimizer = None
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    ids = _batch(CONFIG["vocab_size"])
    batch = {"tokens": ids, "labels": ids.clone()}
    # the step, as recipes/full_finetune_single_device.py train() and _loss_step() run it
    marks = optimizer_marks(meter) if not in_bwd else contextlib.nullcontext()
    with marks:
        meter.begin("forward")
        num_tokens = (batch["labels"] != loss_fn.ignore_index).sum()
        labels = batch.pop("labels")
        logits = model(**batch)
        labels = torch.hstack((labels[..., 1:], ignore_labels_cache[: labels.shape[0]]))
        if not isinstance(logits, list):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = loss_fn(logits, labels)
        del logits
        current_loss = loss * num_tokens
        meter.end("forward")
        meter.begin("backward")
        current_loss.backward()
        if not in_bwd:
            training.scale_grads(model, 1 / num_tokens)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            meter.end("backward")
    return {"versions": _versions("torchtune", "torchao")}


def run_hf5(case, meter, tmp):
    """transformers 5.x's defaults: a checkpoint saved in bfloat16 and loaded without dtype=, Trainer(bf16=True)
    and its default optimizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(0)
    cfg = CONFIGS[case["config"]]
    ckpt = os.path.join(tmp, "ckpt")
    c = AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items()
                                                    if k not in ("architectures", "model_type", "torch_dtype")})
    c.use_cache = False
    AutoModelForCausalLM.from_config(c, dtype=torch.bfloat16).save_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    # safetensors maps a checkpoint already in the parameters' dtype into memory, where the tracker (c10's
    # allocator) does not see it; on a GPU the weights are copied to the device. Own them, as the device does.
    for prm in model.parameters():
        prm.data = prm.data.clone()
    model = _peft(case, model)
    args = _train(model, meter, tmp, cfg["vocab_size"], bf16=case.get("flag", True))
    dtypes = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad})
    return {"versions": _versions("transformers", "peft", "accelerate"), "optim": str(args.optim),
            "experts": getattr(model.config, "_experts_implementation", None), "trainable_dtypes": dtypes}


RUNNERS = {"hf": run_hf, "litgpt": run_litgpt, "torchtune": run_torchtune, "hf5": run_hf5}


# ---------------------------------------------------------------------------------------------------------------
# memplan's predictions of the same jobs

LORA_FLAG = "r=%d,alpha=%g,dropout=%g,targets=%s"


def plan_args(case):
    """`memplan plan` arguments for a case's job (catalog path): the recipe of its framework, its precision,
    and the switches whose value on CPU or in the pinned versions differs from the recipe's, each with the
    source that says so."""
    fw = case["framework"]
    a = ["--model", "CONFIG.json", "--recipe", fw, "--micro-batch", str(BATCH), "--seq", str(SEQ), "--kernels", "cpu"]
    if case["precision"] != "checkpoint":
        a += ["--precision", case["precision"]]
    if fw in ("hf", "litgpt"):
        # torch.optim.AdamW(foreach=None): torch/optim/optimizer.py _default_to_fused_or_foreach picks foreach
        # only when every tensor is on CUDA (or another foreach-supporting device); on CPU the per-parameter
        # loop (_single_tensor_adamw) runs. The recipes' "foreach" is that default on CUDA.
        a += ["--set", "optimizer.impl=single"]
    if case.get("checkpoint"):
        # TrainingArguments(gradient_checkpointing=True): every decoder layer under torch.utils.checkpoint
        a += ["--checkpoint", "full"]
    if case.get("lora"):
        drop = LORA["dropout"] if fw != "torchtune" else 0.0
        # litgpt's finetune/lora.py defaults adapt the query and value columns of its fused qkv linear
        tg = "qkv_proj,qkv=q+v" if fw == "litgpt" else ",".join(LORA["targets"])
        a += ["--lora", LORA_FLAG % (LORA["r"], LORA["alpha"], drop, tg)]
    if fw == "torchtune":
        # torchtune/modules/rms_norm.py @v0.6.1: F.rms_norm(x.float(), weight=self.scale).to(x.dtype); the fused
        # kernel refuses a float32 input with a bfloat16 weight ("Cannot dispatch to fused implementation",
        # aten/src/ATen/native/layer_norm.cpp @v2.14.1), so composite ops run and keep the float32 normalised
        # states for the weight's gradient (the recipe's eager value is 0.4's x_normed.type_as(x) * self.scale)
        a += ["--set", "kernels.rms-norm=fp32-weight"]
    if fw == "litgpt":
        # litgpt/model.py @v0.5.13 RMSNorm.forward upcasts (x.float(), times weight.float(), cast back) where the
        # recipe's lit-gpt 8641822 stays in bfloat16; the recipe's mean-saves-input is PyTorch 2.1's autograd,
        # and torch 2.14.1's MeanBackward keeps no input (the suite's traces save nothing for mean.dim)
        a += ["--set", "kernels.rms-norm=fp32-weight", "--set", "autograd.mean-saves-input=false"]
        if not case.get("lora"):
            # finetune/full.py @v0.5.13 runs the head whole (model(input_ids)); Fabric casts the logits to float32
            # when the model returns (lightning/fabric/plugins/precision/half.py and amp.py @2.6.6
            # convert_output); chunked_cross_entropy(logits[..., :-1, :], ...) reshapes them and runs
            # cross_entropy 128 rows at a time (litgpt/utils.py @v0.5.13). The recipe's loss is lit-gpt 8641822's
            # finetune/lora.py one (the head in 128-token chunks), which 0.5.13's lora.py still runs.
            a += ["--set", "loss=chunked:rows=128,fp32-outputs"]
    if case.get("in_backward"):
        a += ["--set", "optimizer.in-backward=true"]
    return a


def _plan(memplan, args, config_path):
    args = [config_path if x == "CONFIG.json" else x for x in args]
    r = subprocess.run([memplan, "plan", "--json", "--no-timeline"] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise FrameworkError("memplan plan %s: %s" % (" ".join(args), r.stderr.decode().strip()))
    d = json.loads(r.stdout)
    f = d.get("first_step") or d
    return {"phases": {p: f["phases"][p]["peak_bytes"] for p in PHASES if p in f["phases"]},
            "peak_bytes": f["peak"]["bytes"], "peak_phase": f["peak"]["phase"],
            "ops": {p: "%s (%s)" % (f["phases"][p]["op"], f["phases"][p]["module"] or "-")
                    for p in PHASES if p in f["phases"]}}


def predict_catalog(case, memplan, config_path):
    return _plan(memplan, plan_args(case), config_path)


# the trace path: the same model and loss, traced by memplan_torch's exporter (its own loop: forward with the
# loss, the outputs dropped, backward, the optimizer step) and replayed by `memplan plan --graph`

def _hf_step_module(case):
    import torch

    class HFStep(torch.nn.Module):
        """Trainer's compute_loss: the model's own loss from labels, under accelerate's autocast for bf16."""

        def __init__(self, model, amp):
            super().__init__()
            self.model = model
            self.amp = amp

        def forward(self, input_ids, labels):
            ctx = torch.autocast("cpu", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()
            with ctx:
                return self.model(input_ids=input_ids, labels=labels).loss

    model = _hf_model(case["precision"])
    if case.get("lora"):
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"],
                                                 lora_dropout=LORA["dropout"],
                                                 target_modules=list(LORA["targets"]), task_type="CAUSAL_LM"))
    return HFStep(model, case["precision"] == "amp-bf16")


def trace_builder(case):
    """(builder(batch_size, seq_len=None) -> (model, inputs, loss_fn[, targets]), optimizer callable), or the
    reason the exporter cannot run the case's step."""
    import torch
    fw = case["framework"]
    if case.get("in_backward"):
        return ("the exporter's loop steps one optimizer after backward; torchtune's optimizer_in_bwd steps one per "
                "parameter inside it (training.register_optim_in_bwd_hooks)")
    if fw == "litgpt" and not case.get("lora"):
        why = ("litgpt's chunked_cross_entropy splits the B*(S-1) rows into 128-row chunks (litgpt/utils.py "
               "@v0.5.13), so the op sequence changes with the batch and the exporter's size model cannot fit it")
        if case["precision"] == "amp-bf16":
            why += ("; Fabric's bf16-mixed also refuses the exporter's loss.backward() (\"requires you to call "
                    "fabric.backward(loss)\")")
        return why
    if fw == "hf5":
        return ("the hf5 cases check the recipe's defaults, which only the catalog path reads (a trace records the "
                "dtypes and kernels it ran)")
    if fw == "hf":
        def build(b, seq_len=SEQ):
            m = _hf_step_module(case)
            ids = _batch(CONFIG["vocab_size"])[:1].repeat(b, 1)[:, :seq_len]
            return m, {"input_ids": ids, "labels": ids.clone()}, lambda loss: loss
        return build, lambda ps: torch.optim.AdamW(ps, lr=5e-5, foreach=False)
    if fw == "litgpt":  # LoRA (finetune/lora.py): the head in 128-token chunks, one per sequence here
        import lightning as L
        from litgpt.lora import GPT, mark_only_lora_as_trainable
        from litgpt.utils import chunked_cross_entropy

        def build(b, seq_len=SEQ):
            precision = {"pure-bf16": "bf16-true", "amp-bf16": "bf16-mixed"}[case["precision"]]
            fabric = L.Fabric(accelerator="cpu", devices=1, precision=precision)
            with fabric.init_module(empty_init=False):
                model = GPT(_litgpt_config(True))
                mark_only_lora_as_trainable(model)
            model = fabric.setup_module(model)
            ids = _batch(CONFIG["vocab_size"])[:1].repeat(b, 1)[:, :seq_len]

            def loss(logits, targets):
                logits[-1] = logits[-1][..., :-1, :]
                return chunked_cross_entropy(logits, targets[..., 1:])
            return model, {"idx": ids, "lm_head_chunk_size": 128}, loss, ids.clone()
        return build, lambda ps: torch.optim.AdamW(ps, lr=3e-4, weight_decay=0.02, betas=(0.9, 0.95))
    if fw == "torchtune":
        def build(b, seq_len=SEQ):
            from torchtune.modules.loss import CEWithChunkedOutputLoss
            model = _torchtune_llama(bool(case.get("lora")), torch.bfloat16)
            loss_fn = CEWithChunkedOutputLoss()
            model.set_num_output_chunks(loss_fn.num_output_chunks)
            ids = _batch(CONFIG["vocab_size"])[:1].repeat(b, 1)[:, :seq_len]

            def loss(logits, labels):
                num_tokens = (labels != loss_fn.ignore_index).sum()
                ignore = torch.full((labels.shape[0], 1), loss_fn.ignore_index)
                labels = torch.hstack((labels[..., 1:], ignore))
                return loss_fn(logits, labels) * num_tokens
            return model, {"tokens": ids}, loss, ids.clone()
        return build, lambda ps: torch.optim.AdamW(ps, lr=2e-5, fused=True)
    return None


def predict_trace(case, memplan, out_dir):
    """Exports the case's step (real CPU execution, batches BATCH/2 and BATCH) and replays it at BATCH with
    `memplan plan --graph`; None where the exporter cannot run the step."""
    from .export import export_builder
    from .trace import ExportError
    tb = trace_builder(case)
    if isinstance(tb, str):
        return {"error": tb}
    build, opt = tb
    path = os.path.join(out_dir, case["name"] + ".trace.json")
    try:
        export_builder(None, path, batch=BATCH // 2, seq_len=SEQ, optimizer=opt, device="cpu",
                       name=case["name"], builder=build)
    except ExportError as e:  # e.g. a loop whose op sequence depends on the batch size
        return {"error": str(e).splitlines()[0]}
    r = _plan(memplan, ["--graph", path, "--micro-batch", str(BATCH), "--set",
                        "loop.hold-outputs=" + HOLD[case["framework"]]], None)
    r["trace"] = path
    return r


def _versions(*names):
    import importlib.metadata as md
    out = {}
    for n in ("torch",) + names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            out[n] = None
    return out


def measure_case(case, counters, runs=2):
    """Runs a case `runs` times in this process (under the tracker) and returns the last run's phases."""
    res = None
    for _ in range(runs):
        meter = Meter(counters)
        with tempfile.TemporaryDirectory() as tmp:
            meter.set_floor()
            t0 = time.time()
            info = RUNNERS[case["framework"]](case, meter, tmp)
            gc.collect()
            res = {"phases": {p: meter.phases.get(p, 0) for p in PHASES}, "end_bytes": meter.live(),
                   "floor_bytes": meter.floor, "wall_s": round(time.time() - t0, 2), **info}
    res["peak_bytes"] = max(res["phases"].values())
    res["peak_phase"] = max(PHASES, key=lambda p: res["phases"][p])
    return res


def _child_main(names, out, runs=2):
    from . import tracker
    c = tracker.counters()
    if c is None:
        raise SystemExit("memplan_torch.frameworks: the tracker is not active in the measuring process")
    res = {}
    for i, n in enumerate(names):
        # the process's first step pays for lazy initialisations that belong to no job (measured: 133,632 bytes
        # more in every phase of the first case when it ran first); later cases start from a warm process
        res[n] = measure_case(case_by_name(n), c, runs=runs if i == 0 else 1)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def measure(names, threshold=None, runs=2):
    """Measures cases in a child process under the LD_PRELOAD tracker; returns {name: result}."""
    from . import tracker
    env = tracker.preload_env(threshold or tracker.DEFAULT_THRESHOLD)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in sys.path if p and os.path.isdir(p)])
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "measured.json")
        r = subprocess.run([sys.executable, "-m", "memplan_torch.frameworks", "--child", out, "--runs", str(runs),
                            "--cases", ",".join(names)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise FrameworkError("memplan_torch.frameworks: measuring %s failed:\n%s"
                                 % (", ".join(names), r.stdout.decode(errors="replace")[-4000:]))
        with open(out) as f:
            return json.load(f)


# cases whose trace the suite takes by default (each export runs four real steps under the recorder; all cases
# with --trace all); the rest are measured and predicted by the catalog path only
TRACED = ("hf-full-amp", "hf-lora-bf16", "litgpt-lora-bf16", "torchtune-lora-bf16")


def _err(pred, meas):
    return None if pred is None or not meas else pred / meas - 1


def _mib(n):
    return "–" if n is None else "%.2f MiB" % (n / 2 ** 20)


def _pct(e):
    return "–" if e is None else "%+.2f%%" % (100 * e)


def run(out, memplan, cases=None, trace=TRACED, log=print):
    """Measures the cases, predicts each by the catalog path (and the trace path for those in `trace`), writes
    DIR/frameworks.json and DIR/table.md, and returns the rows."""
    os.makedirs(out, exist_ok=True)
    names = cases or [c["name"] for c in CASES]
    t0 = time.time()
    measured = measure(names)
    log("measured %d cases in %.0fs" % (len(names), time.time() - t0))
    paths = {}
    for k, cfg in CONFIGS.items():
        paths[k] = os.path.join(out, "CONFIG.json" if k == "llama" else "CONFIG-%s.json" % k)
        with open(paths[k], "w") as f:
            json.dump(cfg, f, indent=1)
    rows = []
    for n in names:
        c = case_by_name(n)
        m = measured[n]
        cat = predict_catalog(c, memplan, paths[c.get("config", "llama")])
        tr = None
        if trace == "all" or n in (trace or ()):
            ts = time.time()
            tr = predict_trace(c, memplan, out)
            if tr is not None:
                log("traced %s in %.0fs%s" % (n, time.time() - ts, (": " + tr["error"]) if "error" in tr else ""))
        row = {"case": n, "framework": c["framework"], "config": c.get("config", "llama"), "precision": c["precision"],
               "lora": bool(c.get("lora")),
               "in_backward": bool(c.get("in_backward")), "versions": m["versions"],
               "measured": m, "catalog": cat, "trace": tr,
               "plan_args": plan_args(c),
               "catalog_error": {p: _err(cat["phases"].get(p), m["phases"][p]) for p in PHASES},
               "catalog_peak_error": _err(cat["peak_bytes"], m["peak_bytes"])}
        if tr is not None and "error" not in tr:
            row["trace_error"] = {p: _err(tr["phases"].get(p), m["phases"][p]) for p in PHASES}
            row["trace_peak_error"] = _err(tr["peak_bytes"], m["peak_bytes"])
        rows.append(row)
    with open(os.path.join(out, "frameworks.json"), "w") as f:
        json.dump({"schema": "memplan.frameworks/v1", "config": CONFIG, "configs": CONFIGS, "batch": BATCH, "seq": SEQ,
                   "rows": rows}, f, indent=1)
    text = table(rows)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    log(text)
    return rows


def unexplained(rows, tol=TOLERANCE):
    """Phase errors beyond tol with no explanation, or outside the range their explanation was measured in."""
    bad = []
    for r in rows:
        for path in ("catalog", "trace"):
            errs = r.get(path + "_error") or {}
            ex = EXPLAINED.get((r["case"], path), {}).get("phases", {})
            for p, e in errs.items():
                if e is None or abs(e) <= tol:
                    continue
                lo_hi = ex.get(p)
                if lo_hi is None or not lo_hi[0] <= e <= lo_hi[1]:
                    bad.append("%s %s %s: %+.2f%%%s" % (r["case"], path, p, 100 * e, "" if lo_hi is None else
                                                       " (explained for %+.1f%% to %+.1f%%)" % (100 * lo_hi[0],
                                                                                              100 * lo_hi[1])))
    return bad


def table(rows):
    lines = ["| case | framework | precision | measured peak | catalog | err | trace | err | "
             "catalog err forward / backward / optimizer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, cat, tr = r["measured"], r["catalog"], r["trace"]
        v = r["versions"]
        fwv = {"hf": "transformers %s" % v.get("transformers"), "hf5": "transformers %s" % v.get("transformers"),
               "litgpt": "litgpt %s" % v.get("litgpt"),
               "torchtune": "torchtune %s" % v.get("torchtune")}[r["framework"]]
        lines.append("| %s | %s | %s | %s (%s) | %s | %s | %s | %s | %s |" % (
            r["case"], fwv, r["precision"], _mib(m["peak_bytes"]), m["peak_phase"], _mib(cat["peak_bytes"]),
            _pct(r["catalog_peak_error"]), _mib(tr["peak_bytes"]) if tr and "error" not in tr else "–",
            _pct(r.get("trace_peak_error")), " / ".join(_pct(r["catalog_error"][p]) for p in PHASES)))
    notes = []
    for r in rows:
        tr = r["trace"]
        if tr is None:
            pass
        elif "error" in tr:
            notes.append("%s: no trace (%s)" % (r["case"], tr["error"]))
        elif r.get("trace_error"):
            notes.append("%s: trace error forward / backward / optimizer %s" % (
                r["case"], " / ".join(_pct(r["trace_error"][p]) for p in PHASES)))
        for path in ("catalog", "trace"):
            ex = EXPLAINED.get((r["case"], path))
            if ex:
                notes.append("%s, %s path: %s" % (r["case"], path, ex["why"]))
    return "\n".join(lines) + "\n\n" + "\n".join("- " + n for n in notes) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m memplan_torch.frameworks",
                                description="one training step of real frameworks on CPU, measured, against "
                                            "memplan's catalog and trace predictions")
    p.add_argument("--out", default=None, help="directory for frameworks.json, table.md and the traces")
    p.add_argument("--memplan", default=None, help="the memplan binary (default: go build ./cmd/memplan)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--trace", default=",".join(TRACED),
                   help="cases also predicted by the trace path: comma-separated names, 'all' or 'none'")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    names = [n for n in a.cases.split(",") if n] or [c["name"] for c in CASES]
    try:
        for n in names:
            case_by_name(n)
        if a.child:
            _child_main(names, a.child, a.runs)
            return 0
        if a.measure_only:
            print(json.dumps(measure(names, runs=a.runs), indent=1))
            return 0
        trace = "all" if a.trace == "all" else [n for n in a.trace.split(",") if n and n != "none"]
        for n in ([] if trace == "all" else trace):
            case_by_name(n)
        if a.memplan and not (os.path.isfile(a.memplan) and os.access(a.memplan, os.X_OK)):
            raise FrameworkError("memplan_torch.frameworks: --memplan %s is not an executable file" % a.memplan)
        out = a.out or tempfile.mkdtemp(prefix="memplan-frameworks.")
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as e:
            raise FrameworkError("memplan_torch.frameworks: --out %s: %s" % (out, e.strerror or e))
        memplan = a.memplan or _build_memplan(out)
        run(out, memplan, names, trace)
    except FrameworkError as e:
        print(str(e), file=sys.stderr)
        return 1
    return 0


def _build_memplan(out):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    exe = os.path.join(out, "memplan")
    r = subprocess.run(["go", "build", "-o", exe, "./cmd/memplan"], cwd=repo, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    if r.returncode != 0:
        raise FrameworkError("memplan_torch.frameworks: go build ./cmd/memplan failed (give --memplan BIN):\n%s"
                             % r.stdout.decode(errors="replace")[-2000:])
    return exe


if __name__ == "__main__":
    sys.exit(main())
