"""Small schemes and TinyLM models of the trained-in methods' tests (CoPE, FoX, FIRE and their caches)."""

from __future__ import annotations

import torch

import posenc
from posenc import PositionScheme


def _scheme(name, train_len=16, **params):
    return PositionScheme.preset(name, train_len=train_len, **params)


def _model(scheme, seed=0):
    torch.manual_seed(seed)
    model = posenc.TinyLM(posenc.LMConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, scheme=scheme,
                                          train_len=16)).eval()
    return _randomize_(model, seed=seed)


def _randomize_(module, scale=0.5, seed=0):
    """Give the learned positional parts non-trivial values (CoPE's table starts at zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "pos_emb" in name or "gate." in name or ".bias.w" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module
