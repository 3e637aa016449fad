"""What the published mapping assumes of the transformers release the PyTorch 2.x environment pins
(python/requirements-torch2.txt), measured on CPU so that an upgrade which changes it fails here
(published/predict.go gqaInSDPA and loadedPrecision, TestGQAInSDPAByEra and TestLoadDTypeByEra)."""

import pytest
import torch

from memplan_torch.hf import transformers_available

needs_transformers = pytest.mark.skipif(not transformers_available(), reason="needs transformers (python/requirements-torch2.txt)")


def _tiny_llama(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    # grouped-query attention: 8 heads over 2 key/value heads
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, dtype=dtype)
    return LlamaForCausalLM(cfg).to(dtype)


@needs_transformers
def test_from_pretrained_loads_the_checkpoints_dtype(tmp_path):
    """transformers 5.x: from_pretrained without dtype= loads the checkpoint's dtype (dtype "auto",
    modeling_utils.py _get_dtype @v5.0.0); 4.x loaded float32. A Trainer row on 5.x with bf16=True over a bfloat16
    checkpoint is therefore pure-bf16."""
    import transformers
    from transformers import LlamaForCausalLM
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers %s loads float32 unless told" % transformers.__version__)
    _tiny_llama(torch.bfloat16).save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


@needs_transformers
def test_sdpa_takes_grouped_heads_without_a_mask(monkeypatch):
    """transformers 4.54+: with no padding token the causal mask is left to SDPA's is_causal (attention_mask None)
    and use_gqa_in_sdpa passes enable_gqa instead of repeat_kv's copies; a padded batch keeps the mask and the
    copies (integrations/sdpa_attention.py, masking_utils.py _ignore_causal_mask_sdpa)."""
    import transformers.integrations.sdpa_attention as sa
    if not hasattr(sa, "use_gqa_in_sdpa"):
        pytest.skip("this transformers repeats grouped heads always (before 4.54)")
    seen = []
    orig = sa.use_gqa_in_sdpa

    def spy(mask, *rest):
        r = orig(mask, *rest)
        seen.append((mask is None, r))
        return r

    monkeypatch.setattr(sa, "use_gqa_in_sdpa", spy)
    m = _tiny_llama(torch.float32)
    m.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 256, (2, 16))
    m(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss.backward()
    assert seen == [(True, True)] * 2, seen
    seen.clear()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    m(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    assert seen == [(False, False)] * 2, seen


@needs_transformers
def test_moe_experts_default_to_grouped_mm():
    """transformers 5.x: a mixture of experts runs grouped_mm unless another experts_implementation is asked for
    (modeling_utils.py get_correct_experts_implementation): the hf5 recipe's moe.experts=grouped-mm."""
    import transformers
    from transformers import MixtralConfig, MixtralForCausalLM
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers %s loops over the experts" % transformers.__version__)
    cfg = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    m = MixtralForCausalLM(cfg)
    assert m.config._experts_implementation == "grouped_mm"
    experts = m.model.layers[0].mlp.experts
    # two 3-D parameters for all experts, not one nn.Linear per expert projection
    assert sorted(n for n, _ in experts.named_parameters()) == ["down_proj", "gate_up_proj"]
    assert experts.gate_up_proj.dim() == 3


@needs_transformers
def test_trainer_default_optimizer_is_fused_adamw(tmp_path):
    """transformers 4.54+ on PyTorch 2.8+: TrainingArguments' default optim is adamw_torch_fused
    (training_args.py __post_init__): the hf5 recipe's optimizer.impl=fused."""
    from transformers import TrainingArguments
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 8):
        pytest.skip("PyTorch %s: the default is adamw_torch" % torch.__version__)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    assert str(args.optim.value if hasattr(args.optim, "value") else args.optim) == "adamw_torch_fused"
