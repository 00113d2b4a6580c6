"""LongLoRA's shifted sparse attention (S^2-Attn; Chen et al., arXiv:2309.12307, Sec. 3.2) for training.

The ``N`` tokens of a window are split into groups of ``G = N / n_groups`` tokens (the paper's default: 4
groups, ``G = N/4``) and each query attends causally within its own group only. In half of the heads the
groups are shifted by ``G/2``, so information flows between neighbouring groups; the model is trained this
way and evaluated with full attention (the paper's Table 2: S^2 at training, standard attention at
inference).

LongLoRA's code shifts by rolling the tokens, which puts the last ``G/2`` tokens and the first ``G/2`` into
one group (a query at the start then sees keys from the end of the window). Here the shifted heads' groups
are ``[0, G/2)``, ``[G/2, 3G/2)``, ..., ``[N - G/2, N)``: the same boundaries without the wrap, so every token
is in exactly one group of each half and nothing is seen out of order (:func:`s2_groups`).

:func:`s2_attention` is a context manager that makes every :class:`~posenc.engine.module.PositionalAttention`
of a model compute S^2 attention (per group, the scheme's own ``run_attention`` on that group's tokens and their
true positions) and restores full attention on exit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from posenc._util import as_positions, check_positive_int
from posenc.engine.dispatch import run_attention
from posenc.engine.module import PositionalAttention


def s2_groups(n_tokens: int, n_groups: int, shifted: bool) -> list[tuple[int, int]]:
    """The ``[start, end)`` token ranges of S^2 groups: ``n_groups`` groups of ``G = n_tokens / n_groups``;
    ``shifted``: boundaries moved by ``G/2`` (``[0, G/2)``, then ``G``-sized groups, then ``[N - G/2, N)``).
    ``n_tokens`` must be divisible by ``n_groups`` and ``G`` even."""
    n_tokens, n_groups = check_positive_int("n_tokens", n_tokens), check_positive_int("n_groups", n_groups)
    if n_tokens % n_groups or (n_tokens // n_groups) % 2:
        raise ValueError(f"s2_groups: n_tokens ({n_tokens}) must be divisible by n_groups ({n_groups}) into an even "
                         f"group size")
    g = n_tokens // n_groups
    if not shifted:
        return [(s, s + g) for s in range(0, n_tokens, g)]
    h = g // 2
    return [(0, h), *[(s, s + g) for s in range(h, n_tokens - h, g)], (n_tokens - h, n_tokens)]


def _grouped(parts, q, k, v, pos, groups, impl) -> torch.Tensor:
    """Attention of ``q [B,H,N,D]``, ``k, v [B,Hk,N,D]`` (positions ``pos [B,N]``) within each ``[s, e)`` of
    ``groups``; equal sized groups run as one call with the groups folded into the batch."""
    B, h, N, D = q.shape
    out = torch.empty_like(q)
    sizes: dict[int, list[int]] = {}
    for s, e in groups:
        sizes.setdefault(e - s, []).append(s)
    for size, starts in sizes.items():
        idx = torch.tensor(starts, device=q.device)[:, None] + torch.arange(size, device=q.device)  # [n, size]
        n = len(starts)
        qg, kg, vg = (t[:, :, idx].permute(0, 2, 1, 3, 4).reshape(B * n, t.shape[1], size, D)  # [B*n, h', size, D]
                      for t in (q, k, v))
        p = pos[:, idx].reshape(B * n, size)  # [B*n, size]
        o = run_attention(parts, qg, kg, vg, p, p, impl=impl)  # [B*n, h, size, D]
        out[:, :, idx] = o.reshape(B, n, h, size, D).permute(0, 2, 1, 3, 4)
    return out


def s2_forward(attn: PositionalAttention, n_groups: int, x: torch.Tensor, positions=None, impl: str = "auto",
               **kw) -> torch.Tensor:
    """One S^2 attention layer: ``attn``'s projections, then heads ``[0, H/2)`` attend within the plain groups
    and heads ``[H/2, H)`` within the shifted ones (:func:`s2_groups`), then ``attn``'s output projection.
    Training only: a cache, context, key mask, memory or forget gate is refused."""
    if any(kw.get(name) is not None for name in ("cache", "context", "key_mask")):
        raise ValueError("s2 attention trains on plain windows: no cache, context or key_mask")
    if attn.memory is not None or attn.gate is not None or attn.parts.multiaxis is not None:
        raise ValueError("s2 attention needs a plain attention layer (no memory, forget gate or multi-axis part)")
    B, N, _ = x.shape
    pos = as_positions(positions, B, N, x.device)
    q, k, v = attn.project(x)  # [B,H,N,D], [B,Hk,N,D]
    H = q.shape[1]
    if H % 2:
        raise ValueError(f"s2 attention shifts half of the heads: n_heads must be even, got {H}")
    half = H // 2
    # every head runs through the layer's parts (per-head slopes, tables), so both groupings are computed on all
    # heads and each half of the heads keeps its own: heads [0, H/2) the plain groups, [H/2, H) the shifted ones
    plain = _grouped(attn.parts, q, k, v, pos, s2_groups(N, n_groups, False), impl)  # [B,H,N,D]
    shifted = _grouped(attn.parts, q, k, v, pos, s2_groups(N, n_groups, True), impl)
    out = torch.cat([plain[:, :half], shifted[:, half:]], dim=1)  # [B,H,N,D]
    return attn.o_proj(out.transpose(1, 2).reshape(B, N, attn.dim))


@contextlib.contextmanager
def s2_attention(model: torch.nn.Module, n_groups: int = 4) -> Iterator[None]:
    """Within the block, every :class:`PositionalAttention` of ``model`` computes S^2 attention with
    ``n_groups`` groups (LongLoRA's default 4); full attention is restored on exit (also on an exception)."""
    n_groups = check_positive_int("n_groups", n_groups)
    layers = [m for m in model.modules() if isinstance(m, PositionalAttention)]
    for m in layers:
        m.forward = (lambda layer: lambda *a, **kw: s2_forward(layer, n_groups, *a, **kw))(m)
    try:
        yield
    finally:
        for m in layers:
            del m.forward  # the instance attribute goes; the class's forward is back
