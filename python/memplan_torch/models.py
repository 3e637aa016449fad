"""Model builders of the validation suite: FUNCTION(batch_size, **kw) -> (model, inputs, loss_fn, targets).

Small on purpose: the whole suite runs in a few minutes on two CPU cores.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _ce(out, y):
    return F.cross_entropy(out, y)


def resnet18(batch_size, image=64, classes=10):
    import torchvision
    m = torchvision.models.resnet18(num_classes=classes)
    return m, torch.randn(batch_size, 3, image, image), _ce, torch.randint(0, classes, (batch_size,))


def mobilenet_v2(batch_size, image=64, classes=10):
    import torchvision
    m = torchvision.models.mobilenet_v2(num_classes=classes)
    return m, torch.randn(batch_size, 3, image, image), _ce, torch.randint(0, classes, (batch_size,))


def vit_tiny(batch_size, image=32, classes=10):
    from torchvision.models.vision_transformer import VisionTransformer
    m = VisionTransformer(image_size=image, patch_size=8, num_layers=4, num_heads=4, hidden_dim=64,
                          mlp_dim=256, num_classes=classes)
    return m, torch.randn(batch_size, 3, image, image), _ce, torch.randint(0, classes, (batch_size,))


# torchvision's ViT-B/16 and Swin-T (issue 16: exported at batch 1, where PyTorch's size-1 fast paths turn some
# copies into views), at their published shapes (224x224 images, 1000 classes, random weights), and smaller
# models of the same code (torchvision's VisionTransformer and SwinTransformer classes) for CI
def vit_b_16(batch_size, image=224, classes=1000):
    import torchvision
    m = torchvision.models.vit_b_16(weights=None, num_classes=classes)
    return m, torch.randn(batch_size, 3, image, image), _ce, torch.randint(0, classes, (batch_size,))


def swin_t(batch_size, image=224, classes=1000):
    import torchvision
    m = torchvision.models.swin_t(weights=None, num_classes=classes)
    return m, torch.randn(batch_size, 3, image, image), _ce, torch.randint(0, classes, (batch_size,))


def vit_b16_small(batch_size, image=64, classes=10):
    """ViT-B/16's code (patch 16, class token, torchvision's encoder) at 2 layers of width 96."""
    from torchvision.models.vision_transformer import VisionTransformer
    m = VisionTransformer(image_size=image, patch_size=16, num_layers=2, num_heads=4, hidden_dim=96,
                          mlp_dim=384, num_classes=classes)
    return m, torch.randn(batch_size, 3, image, image), _ce, torch.randint(0, classes, (batch_size,))


def swin_small(batch_size, image=64, classes=10):
    """Swin-T's code (torchvision's SwinTransformer: patch 4, window 7 with padding and shifted windows, patch
    merging) at depths 2/2/2/2 of width 24."""
    from torchvision.models.swin_transformer import SwinTransformer
    m = SwinTransformer(patch_size=[4, 4], embed_dim=24, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8],
                        window_size=[7, 7], stochastic_depth_prob=0.0, num_classes=classes)
    return m, torch.randn(batch_size, 3, image, image), _ce, torch.randint(0, classes, (batch_size,))


class TransformerLM(nn.Module):
    """Embedding + N nn.TransformerEncoderLayer (batch_first) + LM head."""

    def __init__(self, vocab=2000, d_model=128, nhead=4, layers=4, ff=512, max_seq=512, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d_model, nhead, ff, dropout, batch_first=True)
                                     for _ in range(layers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos(pos)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def _lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def transformer_lm(batch_size, seq_len=64, vocab=1000, d_model=64, layers=4):
    m = TransformerLM(vocab=vocab, d_model=d_model, layers=layers, ff=4 * d_model)
    x = torch.randint(0, vocab, (batch_size, seq_len))
    y = torch.randint(0, vocab, (batch_size, seq_len))
    return m, x, _lm_loss, y


class CheckpointedTransformerLM(TransformerLM):
    """TransformerLM whose layers checkpoint themselves inside forward, as a Hugging Face model does after
    `gradient_checkpointing_enable()`: `torch.utils.checkpoint.checkpoint(layer, h, use_reentrant=...)` while
    training. The trace then records the recompute where it runs, inside backward."""

    def __init__(self, reentrant=False, **kw):
        super().__init__(**kw)
        self.reentrant = reentrant

    def forward(self, tokens):
        import torch.utils.checkpoint as cp
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos(pos)
        for layer in self.layers:
            if self.training and torch.is_grad_enabled():
                h = cp.checkpoint(layer, h, use_reentrant=self.reentrant)
            else:
                h = layer(h)
        return self.head(self.norm(h))


def transformer_lm_ckpt(batch_size, seq_len=64, vocab=1000, d_model=64, layers=4, reentrant=False):
    """transformer_lm with every layer under non-reentrant torch.utils.checkpoint (set by the model itself)."""
    m = CheckpointedTransformerLM(reentrant=reentrant, vocab=vocab, d_model=d_model, layers=layers,
                                  ff=4 * d_model)
    x = torch.randint(0, vocab, (batch_size, seq_len))
    y = torch.randint(0, vocab, (batch_size, seq_len))
    return m, x, _lm_loss, y


def transformer_lm_ckpt_reentrant(batch_size, seq_len=64, vocab=1000, d_model=64, layers=4):
    """transformer_lm with every layer under reentrant torch.utils.checkpoint (use_reentrant=True)."""
    return transformer_lm_ckpt(batch_size, seq_len, vocab, d_model, layers, reentrant=True)


class GRUModel(nn.Module):
    def __init__(self, vocab=1000, d=64, hidden=128, layers=2, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.gru = nn.GRU(d, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, tokens):
        out, _ = self.gru(self.embed(tokens))
        return self.head(out[:, -1])


def gru(batch_size, seq_len=32, vocab=1000, classes=10):
    m = GRUModel(vocab=vocab, classes=classes)
    return m, torch.randint(0, vocab, (batch_size, seq_len)), _ce, torch.randint(0, classes, (batch_size,))


def mlp(batch_size, d_in=32, hidden=64, classes=4):
    m = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                      nn.Linear(hidden, classes))
    return m, torch.randn(batch_size, d_in), _ce, torch.randint(0, classes, (batch_size,))


def linear_stack(batch_size, layers=50, width=32):
    """`layers` Linear+ReLU pairs: the exporter's scaling benchmark (python/bench_export_scaling.py)."""
    mods = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods), torch.randn(batch_size, width), None


def mlp_bn(batch_size, d_in=32, hidden=64, classes=4):
    m = nn.Sequential(nn.Linear(d_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return m, torch.randn(batch_size, d_in), _ce, torch.randint(0, classes, (batch_size,))


# ---- a GPT-2 in plain PyTorch with Hugging Face's module structure (GPT2LMHeadModel, eager attention) ----
# Used to check memplan's catalog path (the same config.json through `memplan plan --model`) against a trace.


class Conv1D(nn.Module):
    """transformers.pytorch_utils.Conv1D: y = x @ W + b with W of shape [in, out] (addmm)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class GPT2Attention(nn.Module):
    def __init__(self, n_embd, n_head, n_positions, pdrop):
        super().__init__()
        self.n_head, self.head_dim, self.embed_dim = n_head, n_embd // n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones((n_positions, n_positions), dtype=torch.bool))
                             .view(1, 1, n_positions, n_positions), persistent=False)
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(pdrop)
        self.resid_dropout = nn.Dropout(pdrop)

    def _split_heads(self, t):
        return t.view(t.size()[:-1] + (self.n_head, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(self.embed_dim, dim=2)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        s = q.size(-2)
        causal = self.bias[:, :, :s, :s]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal, w.to(w.dtype), mask_value)
        w = nn.functional.softmax(w, dim=-1).type(v.dtype)
        w = self.attn_dropout(w)
        o = torch.matmul(w, v)
        o = o.permute(0, 2, 1, 3).contiguous()
        o = o.view(o.size()[:-2] + (self.embed_dim,))
        return self.resid_dropout(self.c_proj(o))


class GPT2MLP(nn.Module):
    def __init__(self, n_embd, pdrop):
        super().__init__()
        self.c_fc = Conv1D(4 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, 4 * n_embd)
        self.act = nn.GELU(approximate="tanh")  # gelu_new
        self.dropout = nn.Dropout(pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class GPT2Block(nn.Module):
    def __init__(self, n_embd, n_head, n_positions, pdrop, eps):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=eps)
        self.attn = GPT2Attention(n_embd, n_head, n_positions, pdrop)
        self.ln_2 = nn.LayerNorm(n_embd, eps=eps)
        self.mlp = GPT2MLP(n_embd, pdrop)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, vocab, n_embd, n_layer, n_head, n_positions, pdrop, eps):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.drop = nn.Dropout(pdrop)
        self.h = nn.ModuleList([GPT2Block(n_embd, n_head, n_positions, pdrop, eps) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=eps)

    def forward(self, input_ids):
        pos = torch.arange(0, input_ids.size(-1), dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128, pdrop=0.1, eps=1e-5):
        super().__init__()
        self.transformer = GPT2Model(vocab, n_embd, n_layer, n_head, n_positions, pdrop, eps)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, input_ids):
        return self.lm_head(self.transformer(input_ids))


def _causal_lm_loss(logits, labels):
    # transformers' ForCausalLMLoss with labels already shifted: logits.float(), cross-entropy over [B*S, V]
    logits = logits.float()
    return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


GPT2_TINY = dict(vocab=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128)


def gpt2_tiny(batch_size, seq_len=64):
    """GPT-2 with testdata/torch/gpt2_tiny.config.json's shape."""
    m = GPT2LMHeadModel(**GPT2_TINY)
    x = torch.randint(0, GPT2_TINY["vocab"], (batch_size, seq_len))
    y = torch.randint(0, GPT2_TINY["vocab"], (batch_size, seq_len))
    return m, x, _causal_lm_loss, y


# ---- a Llama in plain PyTorch with Hugging Face's module structure (LlamaForCausalLM, sdpa attention) ----
# No transformers needed. llama_tiny is a test model; llama3_8b has Llama-3-8B's config.json numbers and is
# only for fake export (python/bench_fake_export.py): built for real it would need 16 GB of bf16 weights.

LLAMA3_8B = dict(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336,
                 rope_theta=500000.0, eps=1e-5)
LLAMA_TINY = dict(vocab=1000, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, rope_theta=10000.0,
                  eps=1e-5)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden, eps, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dt)


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, head_dim, theta):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv @ pos).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, hidden, heads, kv_heads, dtype=None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False, dtype=dtype)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        if rep > 1:  # transformers' repeat_kv
            k = k[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)
            v = v[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim).reshape(b, self.heads, s, self.head_dim)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(nn.Module):
    def __init__(self, hidden, intermediate, dtype=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, dtype=dtype)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c, dtype=None):
        super().__init__()
        self.self_attn = LlamaAttention(c["hidden"], c["heads"], c["kv_heads"], dtype)
        self.mlp = LlamaMLP(c["hidden"], c["intermediate"], dtype)
        self.input_layernorm = LlamaRMSNorm(c["hidden"], c["eps"], dtype)
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden"], c["eps"], dtype)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c, dtype=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"], dtype=dtype)
        self.layers = nn.ModuleList([LlamaDecoderLayer(c, dtype) for _ in range(c["layers"])])
        self.norm = LlamaRMSNorm(c["hidden"], c["eps"], dtype)
        self.rotary_emb = LlamaRotaryEmbedding(c["hidden"] // c["heads"], c["rope_theta"])

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(x, pos)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, dtype=None, **config):
        super().__init__()
        c = dict(LLAMA_TINY, **config)
        self.model = LlamaModel(c, dtype)
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False, dtype=dtype)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


def llama_tiny(batch_size, seq_len=32, dtype=torch.float32):
    m = LlamaForCausalLM(dtype=dtype, **LLAMA_TINY)
    x = torch.randint(0, LLAMA_TINY["vocab"], (batch_size, seq_len))
    y = torch.randint(0, LLAMA_TINY["vocab"], (batch_size, seq_len))
    return m, x, _causal_lm_loss, y


def llama_tiny_bf16(batch_size, seq_len=32):
    return llama_tiny(batch_size, seq_len, dtype=torch.bfloat16)


def llama3_8b(batch_size, seq_len=2048, layers=None):
    """Llama-3-8B's shape in bfloat16 (8.03B parameters). Export it with --fake only."""
    c = dict(LLAMA3_8B)
    if layers is not None:
        c["layers"] = layers
    m = LlamaForCausalLM(dtype=torch.bfloat16, **c)
    x = torch.randint(0, c["vocab"], (batch_size, seq_len))
    y = torch.randint(0, c["vocab"], (batch_size, seq_len))
    return m, x, _causal_lm_loss, y


LLAMA_MEDIUM = dict(vocab=32000, hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536, rope_theta=10000.0,
                    eps=1e-5)


def llama_medium(batch_size, seq_len=256):
    """About 58M parameters in float32: big enough that computing the step costs more than recording it."""
    m = LlamaForCausalLM(**LLAMA_MEDIUM)
    x = torch.randint(0, LLAMA_MEDIUM["vocab"], (batch_size, seq_len))
    y = torch.randint(0, LLAMA_MEDIUM["vocab"], (batch_size, seq_len))
    return m, x, _causal_lm_loss, y
