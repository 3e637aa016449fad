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


def mlp_bn(batch_size, d_in=32, hidden=64, classes=4):
    m = nn.Sequential(nn.Linear(d_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return m, torch.randn(batch_size, d_in), _ce, torch.randint(0, classes, (batch_size,))
