"""Attention with a distance-only score bias in O(N) memory, on the fused CPU flash kernel.

A bias that depends only on the distance ``d = m - n`` between query position ``m`` and key
position ``n`` (ALiBi, KERPLE, T5 buckets, Sandwich, a causal sliding window as ``-inf`` beyond
``w``) is a Toeplitz matrix ``T[m, n] = f(m - n)``. Materialising it costs ``H x N x N`` floats
(4 GiB at 16k tokens and 4 heads); FlexAttention's ``score_mod`` avoids that but its compiled CPU
kernel is several times slower than PyTorch's fused flash kernel.

The trick: reverse the keys. With ``j = Nk - 1 - n`` the bias becomes ``f(m + j - Nk + 1)``, a
*Hankel* matrix whose entry depends on ``m + j`` only, so it is a strided view of one vector ``g``
per head with strides ``(1, 1)`` over (query, key): ``g.as_strided((B, H, Nq, Nk), (0, len(g), 1, 1))``.
Every entry of the view aliases ``g`` (``H x (Nq + Nk)`` floats), and PyTorch's CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``) reads an additive mask through its strides
without copying it. Attention does not care about key order, so the output is unchanged. On another device
(:func:`posenc.engine.pieces.fused_lse`) each chunk's view is copied into an aligned bias for the device's kernel:
``H x C x keys`` per chunk, which the backends accept there only for a few queries (a decode step); long runs
go to compiled FlexAttention on such a device.

To keep causal skipping, queries go in chunks of ``C``: a chunk ``[m0, m1)`` attends only the keys
``[lo, m1)`` (``lo = 0``, or ``m1 - C - w + 1`` with a window ``w``), so the wasted work is the
upper triangle of one ``C x C`` block per chunk. Every chunk's view has the same shape rule, so one
vector serves all of them: ``g[u] = f(u - (C - 1))`` for ``u >= C - 1`` and ``-inf`` below (future
keys). ALiBi this way costs little more than bias-free causal SDPA, well below SDPA with the bias
materialised (and its N^2 memory); measurements: ``benchmarks/bench_attention.py`` and ``docs/results/performance.md``.

With ``min_distance`` and ``return_lse`` one call computes a *piece* of the keys (``d >= min_distance``)
and its rows' log-sum-exp, so pieces with different rotations merge exactly: ReRoPE's near branch is a
windowed call, its far branch a ``min_distance = w`` call (the ``band`` backend, :mod:`posenc.engine.backends.band`).
The flash kernel's backward makes the path differentiable in ``q, k, v`` (not in the profile).
"""

from __future__ import annotations

import torch

from posenc.engine.pieces import fused_lse

__all__ = ["toeplitz_attention", "default_chunk"]


def default_chunk(n_queries: int, window: int | None = None) -> int:
    """Query chunk measured best on a 2-core CPU (``toeplitz_chunk_ms`` in ``benchmarks/bench_attention.py``):
    small chunks waste less of the diagonal block, large ones amortise the per-call cost at long lengths.
    With a window a chunk reads ``C + w - 1`` keys for ``C`` queries, so chunks stay near ``w / 8``
    (a chunk as wide as the window reads twice the keys it needs)."""
    c = 256 if n_queries <= 8192 else 1024
    return c if window is None else max(64, min(c, window // 8))


def toeplitz_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, profile: torch.Tensor,
                       q_start: int = 0, window: int | None = None, chunk: int | None = None,
                       min_distance: int = 0, return_lse: bool = False, reversed_keys: bool = False,
                       key_start: int = 0, key_offset: int = 0):
    """Causal attention ``softmax(q k^T + f(m - n)) v`` with the bias given by its distance profile.

    ``q [B,H,Nq,D]`` (softmax scale already folded in), ``k, v [B,Hk,Nk,D]`` (``Hk`` divides ``H``: GQA)
    with keys at positions ``0..Nk-1`` and queries at ``q_start..q_start+Nq-1`` (``q_start + Nq <= Nk``);
    ``profile [H, P]`` with ``profile[h, d]`` the bias at distance ``d`` for ``0 <= d < P``,
    ``P >= min(window, q_start + Nq)`` (``window=None``: no window). A query sees the keys at distances
    ``min_distance <= d < window`` and positions ``>= key_start`` (attention sinks below it are another
    piece, see :mod:`posenc.engine.backends.sinks`).
    Returns ``[B,H,Nq,D]``, and with ``return_lse`` also the log-sum-exp of each row's scores
    ``[B,H,Nq]`` (float32; ``-inf`` and a zero output for a row that sees no key), so pieces computed
    separately merge exactly (the ReRoPE family's near and far branches, see :mod:`posenc.engine.backends.band`).
    ``reversed_keys``: ``k`` and ``v`` are given already reversed along the sequence (index ``Nk-1-n``
    holds key ``n``), so pieces that share them flip them once.
    ``key_offset``: ``k`` and ``v`` hold only the keys at positions ``key_offset ..`` (the earlier ones are
    never read: ``key_start`` or the window excludes them), so a decode step under a window passes (and
    rotates, and reverses) the window's keys only.
    Memory beyond the inputs: the reversed keys/values and ``H x (P + chunk)`` bias entries.
    """
    B, H, Nq, D = q.shape
    Nk = key_offset + k.shape[2]  # keys at positions 0..Nk-1, of which k holds key_offset..
    Hk, n = k.shape[1], k.shape[2]  # key/value heads: H, or a divisor of H (GQA, read by the flash kernel as is)
    if k.shape != (B, Hk, n, D) or H % Hk or v.shape[:3] != (B, Hk, n) or v.shape[-1] != D:
        raise ValueError(f"q/k/v shapes disagree: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q_start < 0 or q_start + Nq > Nk:
        raise ValueError(f"queries at {q_start}..{q_start + Nq - 1} need keys up to that position; got {Nk} keys")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if key_start < 0:
        raise ValueError(f"key_start must be >= 0, got {key_start}")
    first_read = max(key_start, 0 if window is None else q_start - window + 1)
    if key_offset < 0 or key_offset > first_read:
        raise ValueError(f"key_offset must be in [0, {first_read}] (the first key any query reads), got {key_offset}")
    if min_distance < 0 or (window is not None and min_distance >= window):
        raise ValueError(f"min_distance must be >= 0 and below the window, got {min_distance} (window {window})")
    reach = q_start + Nq if window is None else min(window, q_start + Nq)  # distances 0..reach-1 occur
    if profile.dim() != 2 or profile.shape[0] != H or profile.shape[1] < reach:
        raise ValueError(f"profile must be [H={H}, >= {reach}], got {tuple(profile.shape)}")
    C = max(1, min(chunk or default_chunk(Nq, window), Nq))
    # g[u] = f(u - (C - 1)); the largest index any chunk reads is C - 1 + (keys per chunk - 1) + min_distance
    span = Nk if window is None else min(Nk, C + window - 1)
    neg = torch.full((H, C - 1), float("-inf"), dtype=q.dtype, device=q.device)
    prof = profile[:, :min(reach, span)].to(q.dtype)
    if min_distance:
        prof = prof.clone()
        prof[:, :min_distance] = float("-inf")
    tail = torch.full((H, max(0, span - prof.shape[1])), float("-inf"), dtype=q.dtype, device=q.device)
    g = torch.cat([neg, prof, tail], dim=1).contiguous()  # [H, L]
    L = g.shape[1]
    kr, vr = (k, v) if reversed_keys else (k.flip(2), v.flip(2))  # key n sits at index Nk - 1 - n (< Nk - key_offset)
    out = q.new_empty(B, H, Nq, D)  # every chunk writes its rows (a chunk without keys writes zeros)
    lse = torch.empty(B, H, Nq, dtype=torch.float32, device=q.device) if return_lse else None
    for s in range(0, Nq, C):
        e = min(Nq, s + C)
        c, m1 = e - s, q_start + e  # queries at positions m1 - c .. m1 - 1
        lo = max(key_start, 0 if window is None else m1 - c - window + 1)  # first key any query of the chunk sees
        hi = m1 - min_distance  # keys [lo, hi)
        if hi <= lo:  # no query of the chunk sees a key
            out[:, :, s:e] = 0
            if return_lse:
                lse[:, :, s:e] = float("-inf")
            continue
        # query i (position m1 - c + i), reversed key j (position hi - 1 - j):
        # d = i + j - (c - 1) + min_distance, stored at g[d + C - 1]
        mask = g.as_strided((B, H, c, hi - lo), (0, L, 1, 1), g.storage_offset() + C - c + min_distance)
        o, row_lse = fused_lse(q[:, :, s:e], kr[:, :, Nk - hi:Nk - lo], vr[:, :, Nk - hi:Nk - lo], mask)
        if m1 - c - min_distance < lo:  # leading rows of the chunk see no key at all
            seen = torch.arange(m1 - c, m1, device=q.device) - min_distance >= lo  # [c]
            o = torch.where(seen[:, None], o, torch.zeros_like(o))
            row_lse = torch.where(seen, row_lse, torch.full_like(row_lse, float("-inf")))
        out[:, :, s:e] = o
        if return_lse:
            lse[:, :, s:e] = row_lse
    return (out, lse) if return_lse else out
