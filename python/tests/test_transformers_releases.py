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
