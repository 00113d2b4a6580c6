"""The fused CPU flash kernel on rotated queries and the call's own key/value heads (GQA without repeating the
keys), and the key span a call's mask can reach.

PyTorch's ``scaled_dot_product_attention`` (and the CPU flash op it runs) takes ``Hk < H`` key heads itself
(``enable_gqa``), so no backend copies the keys and values per query head. For a few queries (a decode step)
the query heads of one key head are *packed* as rows of that key head instead, ``[B,H,Nq,D] ->
[B,Hk,(H/Hk)*Nq,D]`` (transformers' ``pack_gqa`` does the same for one query): the kernel then reads each key
block once for the whole group, where its GQA path reads it once per query head.

The log-sum-exp pieces run on the device's fused kernel (:func:`fused_lse`): on the CPU the flash op
``_scaled_dot_product_flash_attention_for_cpu`` (which reads an additive mask through its strides: the Toeplitz
view of :mod:`posenc.engine.toeplitz`), on CUDA the memory-efficient kernel
``_scaled_dot_product_efficient_attention`` (additive bias rows aligned to 16 elements, equal query and key heads:
a decode step's GQA query heads are packed as rows, other GQA calls repeat the keys), and on any other device the
same computation in plain torch ops (:func:`math_lse`).
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
    """The device's fused kernel with its rows' log-sum-exp: ``(out [B,H,Nq,Dv], lse [B,H,Nq] float32)``, GQA as
    in :func:`sdpa_gqa` (packed for a few queries). ``mask``: None (every key visible) or bool
    ``[B or 1, 1 or H, Nq, Nk]``; a row that sees no key gets ``out = 0`` and ``lse = -inf`` (the kernels
    themselves leave such a row undefined)."""
    seen = None
    if mask is not None:  # the kernels take an additive mask of q's dtype
        seen = mask.any(dim=-1)  # [B|1,1|H,Nq]
        mask = torch.where(mask, q.new_zeros(()), q.new_full((), float("-inf")))
    o, lse = fused_lse(q, k, v, mask)
    if seen is not None and not bool(seen.all()):
        o = torch.where(seen[..., None], o, torch.zeros_like(o))
        lse = torch.where(seen, lse, torch.full_like(lse, float("-inf")))
    return o, lse


def fused_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None):
    """``(softmax(q k^T + bias) v, logsumexp(q k^T + bias))`` for ``q [B,H,Nq,D]`` (scale folded in), ``k, v
    [B,Hk,Nk,D]`` (``Hk`` divides ``H``) and an additive ``bias`` of q's dtype ``[B or 1, 1 or H, Nq, Nk]`` or
    None, on the device's fused kernel (module docstring). The CPU kernel reads ``bias`` through its strides (a
    strided view costs no copy there); elsewhere the bias is copied into rows aligned for the kernel. Rows whose
    every key is masked are undefined (:func:`flash_lse` zeroes them)."""
    if q.device.type == "cpu":
        return _flash(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, bias)
    kernel = _efficient if q.device.type == "cuda" and q.dtype != torch.float64 else math_lse
    return device_lse(kernel, q, k, v, bias)


def _flash(flash, q, k, v, mask):
    """The CPU flash op, packed (:func:`_pack`) when that applies."""
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


BIAS_ALIGN = 16  # elements: the memory-efficient CUDA kernel reads bias rows at 16-element aligned strides


def device_lse(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None):
    """:func:`fused_lse` through ``kernel(q, k, v, bias) -> (out, lse)``, a kernel that needs as many key heads as
    query heads and an aligned bias: a decode step's GQA query heads packed as rows of their key head, other GQA
    calls with the keys repeated; the bias copied into a buffer whose rows start at multiples of
    :data:`BIAS_ALIGN` elements and broadcast (stride 0) over the batch and heads it does not vary in."""
    B, H, Nq, _ = q.shape
    Hk, Nk = k.shape[1], k.shape[2]
    packed = Hk < H and _packs(q, k, bias)
    if packed:
        q, bias = _pack(q, Hk, bias)
    elif Hk < H:
        k, v = k.repeat_interleave(H // Hk, dim=1), v.repeat_interleave(H // Hk, dim=1)
    if bias is not None:
        rows = q.shape[2]
        width = -(-Nk // BIAS_ALIGN) * BIAS_ALIGN
        buf = q.new_empty(bias.shape[0], bias.shape[1], rows, width)[..., :Nk]
        buf.copy_(bias.expand(bias.shape[0], bias.shape[1], rows, Nk))
        bias = buf.expand(q.shape[0], q.shape[1], rows, Nk)
    o, lse = kernel(q, k, v, bias)
    if packed:
        return o.reshape(B, H, Nq, v.shape[-1]), lse.reshape(B, H, Nq)
    return o, lse


def _efficient(q, k, v, bias):
    """PyTorch's memory-efficient CUDA kernel with its rows' log-sum-exp (``[B,H,>=Nq]``, cut to ``Nq``)."""
    o, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, False, scale=1.0)[:2]
    return o, lse[..., :q.shape[2]].float()


def math_lse(q, k, v, bias):
    """The kernel's computation in plain torch ops (scores and softmax in at least float32, the output in q's
    dtype): devices without a fused kernel, float64, and the check of :func:`device_lse`'s layout on the CPU."""
    wide = torch.promote_types(q.dtype, torch.float32)
    s = q.to(wide) @ k.to(wide).transpose(-1, -2)  # [B,H,Nq,Nk]
    if bias is not None:
        s = s + bias.to(wide)
    lse = torch.logsumexp(s, dim=-1)
    out = (torch.exp(s - lse[..., None]).to(v.dtype) @ v).to(q.dtype)
    return out, lse.float()


def lse_merge(pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``sum_i exp(l_i - logsumexp_j l_j) o_i`` of ``(o_i [B,H,n,D], l_i [B,H,n])``: the softmax over the
    union of the pieces' keys (each ``o_i`` is the softmax over its own keys). A piece with ``l = -inf``
    (no key) weighs 0; every row has at least one finite piece (its own key)."""
    lses = torch.stack([lse for _, lse in pieces])  # [P,B,H,n]
    w = torch.softmax(lses, dim=0)  # [P,B,H,n]
    out = pieces[0][0] * w[0, ..., None].to(pieces[0][0].dtype)
    for (o, _), wi in zip(pieces[1:], w[1:]):
        out = out + o * wi[..., None].to(o.dtype)
    return out


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
