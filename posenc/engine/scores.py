"""Pieces every backend shares: rotating a branch, the query scale, the materialised score tile and
the masked softmax that finishes it.

The score for a pair, with branch b selected by its region:
    s = scale * attn_scale^2 * logn(qp) * temp(qp) * <R(q_rot_b(qp)) q, R(k_rot_b(kp)) k> + bias(h, qp', kp)
        + forget_gate(i, j) + relative_terms,   masked where not allowed.
"""

from __future__ import annotations

import math

import torch

from posenc.engine.call import AttentionCall
from posenc.engine.parts import AttentionParts
from posenc.engine.rotation import Rotated, rotate_branch  # noqa: F401 - Rotated, rotate_branch: re-exported
from posenc.parts.remap import logn_scale


def query_scale(parts: AttentionParts, q_pos, attn_scale: float, dtype, scale: float | None,
                k_pos=None) -> torch.Tensor:
    """[B,1,Nq,1] multiplier folded into q: softmax scale x YaRN factor^2 x the remap's logit scale (STRING's
    attention factor^2) x log-n x temperature. ``k_pos``: the call's key positions, read by a temperature that
    follows the length of the whole call (ChunkLlama's original form, ``length="sequence"``)."""
    d = parts.head_dim
    base = (1.0 / math.sqrt(d)) if scale is None else scale
    if parts.relative is not None:
        base = base * parts.relative.score_scale
    base = base * parts.remap.logit_scale
    if not parts.scheme.logn and parts.temperature is None:  # one constant: built once per shape
        key = (tuple(q_pos.shape), dtype, str(q_pos.device), base * attn_scale * attn_scale)
        hit = parts._scale_cache.get(key)
        if hit is None:
            if len(parts._scale_cache) >= 16:
                parts._scale_cache.clear()
            value = torch.full(q_pos.shape, key[-1], dtype=torch.float64, device=q_pos.device)
            hit = parts._scale_cache[key] = value[:, None, :, None].to(dtype)
        return hit
    s = torch.full(q_pos.shape, base * attn_scale * attn_scale, dtype=torch.float64, device=q_pos.device)
    if parts.scheme.logn:
        s = s * logn_scale(q_pos, parts.scheme.train_len)
    if parts.temperature is not None:
        seq_len = None if k_pos is None or k_pos.numel() == 0 else int(k_pos.max()) + 1
        s = s * parts.temperature.scale(q_pos, seq_len)
    return s[:, None, :, None].to(dtype)  # [B,Nq] -> [B,1,Nq,1]


def content_mask(call: AttentionCall, q: torch.Tensor, qp: torch.Tensor, n_keys: int | None = None
                 ) -> torch.Tensor | None:
    """The remap's own choice of keys for queries ``q [B,H,nq,D]`` at ``qp [B,nq]`` against every key of the call
    (``[B,H|1,nq,Nk]`` bool; :meth:`posenc.parts.remap.Remap.select`), or None when it chooses by position only.
    ``n_keys``: only against the first ``n_keys`` keys (``[B,H|1,nq,n_keys]``; the choice is still made among
    every key, through the call's key summary)."""
    remap = call.parts.remap
    if not remap.reads_content:
        return None
    return remap.select(*_select_args(call, q, qp, n_keys), summary=call.key_summary)


def content_keys(call: AttentionCall, q: torch.Tensor, qp: torch.Tensor, n_keys: int | None = None):
    """:func:`content_mask` in sparse form, ``(idx [K] or None, chosen [B,H|1,nq,K])``
    (:meth:`posenc.parts.remap.Remap.select_keys`): the keys some query chose, and each query's choice;
    ``(None, None)`` when the remap chooses by position only."""
    if not call.parts.remap.reads_content:
        return None, None
    return call.parts.remap.select_keys(*_select_args(call, q, qp, n_keys), summary=call.key_summary)


def _select_args(call: AttentionCall, q, qp, n_keys):
    n = call.Nk if n_keys is None else n_keys
    mask = None if call.key_mask is None else call.key_mask[:, :n]
    return head_index(call.parts, q.device), q, qp, call.k[:, :, :n], call.k_pos[:, :n], mask


def softcap(parts: AttentionParts, scores):
    """Gemma 2's attention-logit soft-capping c * tanh(s / c) of the scaled q.k (before biases)."""
    cap = parts.scheme.softcap
    return scores if cap is None else torch.tanh(scores / cap) * cap


def head_index(parts: AttentionParts, device) -> torch.Tensor:
    return torch.arange(parts.n_heads, device=device)[None, :, None, None]  # [1,H,1,1]


def scores_tile(call: AttentionCall) -> torch.Tensor:
    """Logits [B,H,Nq,Nk] (pre-mask) of the call's queries against its keys, all branches: each pair
    takes the branch whose region holds it."""
    parts, q, k = call.parts, call.q, call.k
    qp = call.q_pos[:, None, :, None]  # [B,1,Nq,1]
    kp = call.k_pos[:, None, None, :]  # [B,1,1,Nk]
    scores = None
    for br in parts.branches:
        region = None if br.region is None else br.region(qp, kp)
        if region is not None and not bool(region.any()):
            continue
        rot = rotate_branch(call, br)
        s = rot.q @ rot.k.transpose(-1, -2)  # [B,H,nq,nk]
        if scores is None:
            scores = s if region is None else torch.where(region, s, torch.zeros_like(s))
        else:
            scores = torch.where(region, s, scores) if region is not None else s
    if scores is None:  # no pair in any region (cannot happen for a partition); keep shapes
        scores = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    scores = softcap(parts, scores)
    if parts.bias is not None:
        scores = scores + parts.bias.score(head_index(parts, q.device), parts.bias_query_pos(qp, kp),
                                           kp).to(scores.dtype)
    gate = call.gate_bias(qp, kp)
    return scores if gate is None else scores + gate.to(scores.dtype)


def weights(parts: AttentionParts, scores, allowed, q, k, q_pos, k_pos, q_scale, sink_logits=None) -> torch.Tensor:
    """The attention weights ``[B,H,Nq,Nk]`` (float32, float64 for float64 inputs) of a score tile: content-relative
    logits, mask, softmax (with ``sink_logits``' virtual keys in the denominator, :func:`finish`); a row with no
    visible key is all 0."""
    if parts.relative is not None:
        scores = parts.relative.logits(scores, allowed, q, k, q_pos, k_pos, q_scale)
    scores = scores.masked_fill(~allowed, float("-inf"))
    wide = torch.promote_types(scores.dtype, torch.float32)  # fp32 softmax for 16-bit inputs; float64 stays float64
    if sink_logits is not None:
        sink = sink_logits.to(wide).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # [B,H,Nq,1]
        probs = torch.softmax(torch.cat((scores.to(wide), sink), dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores.to(wide), dim=-1)
    if not bool(allowed.any(dim=-1).all()):
        probs = torch.nan_to_num(probs, nan=0.0)  # rows with no visible key (and a -inf sink) -> 0 output
    return probs


def finish(parts: AttentionParts, scores, allowed, v, q, k, q_pos, k_pos, q_scale, sink_logits=None):
    """Content-relative terms, mask, softmax (in fp32), values: ``softmax(s + rel, masked) @ v + rel_v``.
    A row with no visible key gives 0 (the softmax's NaN row is zeroed).

    ``sink_logits [H]`` (learned attention sinks, GPT-OSS's ``s_aux``): one more logit per head in every
    softmax denominator, a virtual key of value 0 that no mask hides,
    ``p_j = exp(s_j) / (sum_i exp(s_i) + exp(sink_h))``; a row with no visible key gives 0 here too."""
    probs = weights(parts, scores, allowed, q, k, q_pos, k_pos, q_scale, sink_logits).to(v.dtype)
    out = probs @ v
    if parts.relative is not None:
        extra = parts.relative.values(probs, q_pos, k_pos)
        if extra is not None:
            out = out + extra
    return out
