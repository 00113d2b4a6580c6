"""The fused CPU flash kernel on rotated queries and the call's own key/value heads (GQA without repeating the
keys), and the key span a call's mask can reach.

PyTorch's ``scaled_dot_product_attention`` (and the CPU flash op it runs) takes ``Hk < H`` key heads itself
(``enable_gqa``), so no backend copies the keys and values per query head. For a few queries (a decode step)
the query heads of one key head are *packed* as rows of that key head instead, ``[B,H,Nq,D] ->
[B,Hk,(H/Hk)*Nq,D]`` (transformers' ``pack_gqa`` does the same for one query): the kernel then reads each key
block once for the whole group, where its GQA path reads it once per query head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posenc.engine.call import AttentionCall

PACK_MAX_ROWS = 64  # pack a key head's query heads as rows while (H/Hk) x Nq stays below this


def _packs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the packed layout applies: GQA, few query rows, and a mask shared by the heads or none."""
    H, Hk, Nq = q.shape[1], k.shape[1], q.shape[2]
    return Hk < H and (H // Hk) * Nq <= PACK_MAX_ROWS and (mask is None or mask.shape[1] == 1)


def _pack(q: torch.Tensor, Hk: int, mask: torch.Tensor | None):
    """``q [B,H,Nq,D] -> [B,Hk,g*Nq,D]`` (row ``j*Nq + t`` = query ``t`` of head ``hk*g + j``) and the mask
    ``[B,1,Nq,Nk] -> [B,1,g*Nq,Nk]`` to match."""
    B, H, Nq, D = q.shape
    g = H // Hk
    qp = q.reshape(B, Hk, g * Nq, D)
    if mask is not None and Nq > 1:
        mask = mask.expand(B, g, Nq, mask.shape[-1]).reshape(B, 1, g * Nq, mask.shape[-1])
    return qp, mask


def sdpa_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
             is_causal: bool = False) -> torch.Tensor:
    """``softmax(q k^T + mask) v`` (scale folded into ``q``) for ``q [B,H,Nq,D]``, ``k, v [B,Hk,Nk,D]``
    (``Hk`` divides ``H``): ``[B,H,Nq,Dv]``. ``mask`` bool or additive, ``[B or 1, 1 or H, Nq, Nk]``."""
    B, H, Nq, _ = q.shape
    Hk = k.shape[1]
    if Hk == H:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=1.0)
    if not is_causal and _packs(q, k, mask):
        qp, mp = _pack(q, Hk, mask)
        if mp is not None and mp.shape[0] != B:
            mp = mp.expand(B, *mp.shape[1:])
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mp, scale=1.0)  # [B,Hk,g*Nq,Dv]
        return out.reshape(B, H, Nq, v.shape[-1])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=1.0, enable_gqa=True)


def flash_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """The CPU flash kernel with its rows' log-sum-exp: ``(out [B,H,Nq,Dv], lse [B,H,Nq] float32)``, GQA as
    in :func:`sdpa_gqa` (packed for a few queries). ``mask``: None (every key visible) or bool
    ``[B or 1, 1 or H, Nq, Nk]``; a row that sees no key gets ``out = 0`` and ``lse = -inf`` (the kernel
    itself leaves such a row undefined)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    seen = None
    if mask is not None:  # the op takes an additive mask of q's dtype
        seen = mask.any(dim=-1)  # [B|1,1|H,Nq]
        mask = torch.where(mask, q.new_zeros(()), q.new_full((), float("-inf")))
    o, lse = _flash(flash, q, k, v, mask)
    if seen is not None and not bool(seen.all()):
        o = torch.where(seen[..., None], o, torch.zeros_like(o))
        lse = torch.where(seen, lse, torch.full_like(lse, float("-inf")))
    return o, lse


def _flash(flash, q, k, v, mask):
    """The flash op, packed (:func:`_pack`) when that applies."""
    B, H, Nq, _ = q.shape
    Hk = k.shape[1]
    if Hk < H and _packs(q, k, mask):
        qp, mp = _pack(q, Hk, mask)
        if mp is not None and mp.shape[0] != B:
            mp = mp.expand(B, *mp.shape[1:])
        o, lse = flash(qp, k, v, 0.0, False, attn_mask=mp, scale=1.0)[:2]
        return o.reshape(B, H, Nq, v.shape[-1]), lse.reshape(B, H, Nq)
    o, lse = flash(q, k, v, 0.0, False, attn_mask=mask, scale=1.0)[:2]
    return o, lse


def key_span(call: AttentionCall) -> tuple[int, int]:
    """``[lo, hi)``: the key indices any query of the call may see under the scheme's mask (its
    ``key_intervals``, a superset), when keys sit at their indices; ``(0, Nk)`` otherwise. A decode step
    under a sliding window reads (and rotates) only the window's keys this way."""
    Nk = call.Nk
    intervals = call.parts.mask.key_intervals
    if intervals is None or call.q_gate is not None or not call.keys_are_indices:
        return 0, Nk
    q0 = call.q_run
    q_lo, q_hi = (q0, q0 + call.Nq - 1) if q0 is not None else (int(call.q_pos.min()), int(call.q_pos.max()))
    ivs = intervals(q_lo, q_hi)
    if ivs is None:
        return 0, Nk
    if not ivs:
        return 0, 0
    lo, hi = max(0, min(a for a, _ in ivs)), min(Nk, max(b for _, b in ivs) + 1)
    return (lo, hi) if hi > lo else (0, 0)
