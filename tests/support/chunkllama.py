"""ChunkLlama's prefill (chunkllama_attn_replace.py) written densely, and the HF rotate_half RoPE and dense
softmax it is built from: the reference of Dual Chunk Attention's tests (tests/methods/test_dca.py,
tests/engine/backends/test_chunks.py)."""

from __future__ import annotations

import math

import torch


# ------------------------------------------------------------------ ChunkLlama, dense
def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rot(x, t, inv_freq):
    """HF rotate_half RoPE of ``x [B,H,n,D]`` at float positions ``t [n]``."""
    f = torch.outer(t.double(), inv_freq.double())
    emb = torch.cat((f, f), dim=-1)
    return x * emb.cos().to(x.dtype) + _rotate_half(x) * emb.sin().to(x.dtype)


def _dense(q, k, v, causal):
    """(out, lse) of softmax(q k^T / sqrt(D)) v, causal aligned top-left like flash_attn with Nq == Nk."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def chunkllama(q, k, v, chunk_size, local_window, inv_freq, attn_scale=1.0):
    """ChunkLlama's prefill (``forward`` without a cache), written densely: chunks of c = chunk_size -
    local_window; keys at t % c; intra queries at t % c, successive at min(t % c + c, chunk_size),
    inter at qc_t[c - 1]; per query chunk the pieces merge by their log-sum-exp (``merge_attn_outputs``).
    ``attn_scale`` multiplies cos/sin of q and k (YaRN's attention factor, as HF applies it)."""
    N = q.shape[2]
    c = chunk_size - local_window
    t = torch.arange(N)
    q_t = t % c
    qc_t = (q_t + c).clamp(max=chunk_size)
    inter_t = torch.full((N,), int(qc_t[c - 1]) if N >= c else min(2 * c - 1, chunk_size))
    kr = _rot(k, t % c, inv_freq) * attn_scale
    qi, qs, qx = (_rot(q, tt, inv_freq) * attn_scale for tt in (q_t, qc_t, inter_t))
    outs = [_dense(qi[:, :, :c], kr[:, :, :c], v[:, :, :c], True)[0]]
    for begin in range(c, N, c):
        end = min(N, begin + c)
        pieces = [_dense(qi[:, :, begin:end], kr[:, :, begin:end], v[:, :, begin:end], True),
                  _dense(qs[:, :, begin:end], kr[:, :, begin - c:begin], v[:, :, begin - c:begin], False)]
        if begin - c > 0:
            pieces.append(_dense(qx[:, :, begin:end], kr[:, :, :begin - c], v[:, :, :begin - c], False))
        w = torch.softmax(torch.stack([lse for _, lse in pieces]), dim=0)
        outs.append(sum(o * wi[..., None] for (o, _), wi in zip(pieces, w)))
    return torch.cat(outs, dim=2)
