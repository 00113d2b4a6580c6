"""Helpers of the attention tests: random q/k/v, transformers' rotate-half RoPE in float64, a masked softmax
attention and the causal mask."""

from __future__ import annotations

import torch


def _qkv(B=2, H=4, N=96, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g) for _ in range(3)]


def _hf_rotate(x, pos, inv_freq):
    """HF Llama: cos/sin = cat(freqs, freqs); x*cos + rotate_half(x)*sin (float64 here)."""
    freqs = pos.double()[:, None] * inv_freq.double()[None]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _softmax_attend(scores, v, mask):
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _causal(N):
    return torch.ones(N, N, dtype=torch.bool).tril()


def _qkv_typed(N, B=2, H=2, D=16, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, N, D, generator=g, dtype=dtype) for _ in range(3))
