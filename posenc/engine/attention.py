"""The attention engine: executes any :class:`~posenc.scheme.PositionScheme`.

Shape legend: B batch, H query heads, Hk key/value heads (GQA when Hk < H), Nq queries, Nk keys,
D head dim. Inputs q ``[B,H,Nq,D]``, k/v ``[B,Hk,Nk,D]`` are *un-rotated* projections; positions are
``[B,Nq]`` / ``[B,Nk]`` original token positions (a KV cache stores exactly these).

Paths, one semantics:

``reference``  materialises ``[B,H,Nq,Nk]`` scores; per pair it picks the branch whose region holds
               it, adds biases and content-relative terms, masks, softmaxes. Short and readable:
               the ground truth, and the training path (autograd) at short lengths.
``sdpa``       single-branch schemes: rotate once, fused SDPA with the bias and mask as one additive
               mask (or its own ``is_causal``); the training path.
``blockwise``  the same computation tiled over queries: for each query tile only the key blocks
               the mask allows are gathered, and each remap branch is evaluated only on tiles its
               region touches (boundary tiles twice). Memory O(tile * keys visible), never N x N.
``flex``       ``torch.compile(flex_attention)``: biases as ``score_mod``, masks as block masks
               (fully masked blocks skipped). In torch 2.13 compiled CPU flex has no backward and
               no ``return_lse``, so one flex call covers a single-branch scheme without
               content-relative terms at inference. Multi-branch remaps asked for ``flex`` run the
               LSE band merge (``band``: ReRoPE-like distance bands on the fused CPU flash kernel)
               where it applies, else ``blockwise``.
``toeplitz``   a bias that depends only on the distance (ALiBi, KERPLE, T5, Sandwich) and/or a causal
               sliding window, on the fused CPU flash kernel with the bias as an O(N) strided view
               (:mod:`posenc.engine.toeplitz`). 1.2-1.3x bias-free SDPA here, against 2-3x for materialised
               bias (and N^2 memory) or 4-5x for compiled flex.
``sinks``      attention sinks + a window (StreamingLLM, LM-Infinite): the window piece on the Toeplitz
               kernel, the sink keys scored like ``reference``, merged by log-sum-exp.

``impl="auto"``: see :func:`choose_impl`.

The score for a pair, with branch b selected by its region:
    s = scale * attn_scale^2 * logn(qp) * <R(q_rot_b(qp)) q, R(k_rot_b(kp)) k> + bias(h, qp', kp)
        + relative_terms,   masked where not allowed.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn as nn

from posenc._util import as_positions, check_finite, check_positive_int
from posenc.parts.masks import MaskSpec
from posenc.parts.remap import Branch, Remap, logn_scale
from posenc.scheme.core import PositionScheme

IMPLS = ("auto", "reference", "sdpa", "blockwise", "flex", "toeplitz")
log = logging.getLogger("posenc")


# ====================================================================== runtime parts
class AttentionParts(nn.Module):
    """The scheme's parts for one attention layer, built once: learned tables live here."""

    def __init__(self, scheme: PositionScheme, n_heads: int, head_dim: int):
        super().__init__()
        self.scheme = scheme
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.bias = None
        if scheme.bias is not None:
            from posenc.parts.biases import BIASES

            if scheme.bias.kind not in BIASES:
                raise ValueError(f"unknown bias {scheme.bias.kind!r}; known: {sorted(BIASES)}")
            self.bias = BIASES[scheme.bias.kind](num_heads=n_heads, **scheme.bias.params)
        self.relative = None
        if scheme.relative is not None:
            from posenc.parts.relative import RELATIVE

            if scheme.relative.kind not in RELATIVE:
                raise ValueError(f"unknown relative part {scheme.relative.kind!r}; known: {sorted(RELATIVE)}")
            self.relative = RELATIVE[scheme.relative.kind](n_heads=n_heads, head_dim=head_dim,
                                                           **scheme.relative.params)
        self.remap: Remap = scheme.build_remap()
        self.branches: list[Branch] = self.remap.branches()
        self.mask: MaskSpec = scheme.mask
        self.rope = scheme.rope
        self.rotary_dim = None
        if self.rope is not None:
            rd = int(head_dim * self.rope.partial_rotary_factor)
            if rd % 2 or rd <= 0:
                raise ValueError(f"RoPE needs an even rotary dim; head_dim {head_dim} x partial_rotary_factor "
                                 f"{self.rope.partial_rotary_factor} = {rd}")
            self.rotary_dim = rd
        self._freq_cache: dict = {}

    # ------------------------------------------------------------------ frequencies
    def frequencies(self, length: int | None):
        """RopeFrequencies for a schedule length (None: static schedule)."""
        key = length
        if key not in self._freq_cache:
            from posenc.parts.frequencies import rope_frequencies

            self._freq_cache[key] = rope_frequencies(self.head_dim, base=self.rope.base,
                                                     scaling=self.rope.scaling, seq_len=length,
                                                     partial_rotary_factor=self.rope.partial_rotary_factor)
        return self._freq_cache[key]

    def schedule_lengths(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Per query, the length its dynamic schedule sees ([B,Nq] long), or None if static."""
        if self.rope is None or not self.scheme.is_dynamic:
            return None
        scaling = self.rope.scaling
        floor = int(scaling.get("original_max_position_embeddings") or self.scheme.train_len or 1)
        if self.rope.dynamic == "sequence":
            n = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
            ell = torch.full_like(q_pos, n)
        else:
            step = self.rope.dynamic_step
            ell = torch.div(q_pos + step, step, rounding_mode="floor") * step  # ceil((qp+1)/step)*step
        return ell.clamp(min=floor)

    # ------------------------------------------------------------------ elementwise helpers
    def allowed(self, qp, kp):
        ok = self.mask.allowed(qp, kp)
        extra = self.remap.allowed(qp, kp)
        return ok if extra is None else ok & extra

    def bias_query_pos(self, qp, kp):
        """Positions the bias sees: the remapped relative distance re-expressed as a query position."""
        if type(self.remap).relative is Remap.relative:
            return qp
        return kp + torch.floor(self.remap.relative(qp, kp)).long()

    @property
    def single_branch(self) -> bool:
        return len(self.branches) == 1


@lru_cache(maxsize=64)
def _parts_for(scheme_json: str, n_heads: int, head_dim: int) -> AttentionParts:
    parts = AttentionParts(PositionScheme.from_json(scheme_json), n_heads, head_dim)
    if any(p.requires_grad for p in parts.parameters()):
        raise ValueError("this scheme has learned parameters (bias/relative tables); use "
                         "posenc.PositionalAttention, which owns them, instead of posenc.attention")
    return parts


# ====================================================================== rotation of a branch
@dataclass
class _Rotated:
    q: torch.Tensor  # [B,H,Nq,D] rotated and scaled queries
    k: torch.Tensor  # [B,H,Nk,D] rotated keys


def _rotate_branch(parts: AttentionParts, q, k, q_pos, k_pos, branch: Branch, freqs, q_scale) -> _Rotated:
    """q and k rotated at the branch's positions, the softmax/YaRN/log-n scale folded into q. A side whose
    positions are all 0 (ReRoPE's far keys) is left as it is; with the whole head rotated, q's scale
    multiplies its cos/sin ([B,1,Nq,R/2]) instead of taking another pass over q."""
    from posenc.parts.rotary import _cached_cos_sin, apply_rope, apply_rope_cos_sin, xpos_scale

    if parts.rope is None:
        return _Rotated(q * q_scale, k)
    inv = freqs.inv_freq.to(q.device).double() * branch.freq_scale
    qpr, kpr = branch.q_rot(q_pos), branch.k_rot(k_pos)
    layout, rd, xpos = parts.rope.layout, parts.rotary_dim, parts.rope.xpos
    if not xpos and rd == q.shape[-1] and q.dtype == torch.float32:
        cos, sin = _cached_cos_sin(qpr, inv)  # [B,1,Nq,R/2]
        qs = q_scale.to(torch.float32)  # [B,1,Nq,1]
        qr = apply_rope_cos_sin(q, cos * qs, sin * qs, layout, rd)
    else:
        qr = apply_rope(q, qpr, inv, layout=layout, rotary_dim=rd)
        if xpos:
            qr = qr * xpos_scale(qpr, q.shape[-1], parts.rope.xpos_scale_base, layout=layout).to(q.dtype)
        qr = qr * q_scale
    if not bool(kpr.any()):  # every key at position 0: the identity rotation (and xPos scale 1)
        return _Rotated(qr, k)
    kr = apply_rope(k, kpr, inv, layout=layout, rotary_dim=rd)
    if xpos:
        kr = kr / xpos_scale(kpr, k.shape[-1], parts.rope.xpos_scale_base, layout=layout).to(k.dtype)
    return _Rotated(qr, kr)


def _query_scale(parts: AttentionParts, q_pos, attn_scale: float, dtype, scale: float | None) -> torch.Tensor:
    """[B,1,Nq,1] multiplier folded into q: softmax scale x YaRN factor^2 x log-n."""
    d = parts.head_dim
    base = (1.0 / math.sqrt(d)) if scale is None else scale
    if parts.relative is not None:
        base = base * parts.relative.score_scale
    s = torch.full(q_pos.shape, base * attn_scale * attn_scale, dtype=torch.float64, device=q_pos.device)
    if parts.scheme.logn:
        s = s * logn_scale(q_pos, parts.scheme.train_len)
    return s[:, None, :, None].to(dtype)


def _expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    if x.shape[1] == n_heads:
        return x
    if n_heads % x.shape[1]:
        raise ValueError(f"query heads ({n_heads}) must be a multiple of key/value heads ({x.shape[1]})")
    return x.repeat_interleave(n_heads // x.shape[1], dim=1)  # [B,H,Nk,D]


def _softcap(parts, scores):
    """Gemma 2's attention-logit soft-capping c * tanh(s / c) of the scaled q.k (before biases)."""
    cap = parts.scheme.softcap
    return scores if cap is None else torch.tanh(scores / cap) * cap


# ====================================================================== reference path
def _scores_tile(parts, q, k, q_pos, k_pos, freqs, q_scale):
    """Logits [B,H,nq,nk] (pre-mask) for queries q/q_pos against keys k/k_pos, all branches."""
    qp = q_pos[:, None, :, None]
    kp = k_pos[:, None, None, :]
    scores = None
    for br in parts.branches:
        region = None if br.region is None else br.region(qp, kp)
        if region is not None and not bool(region.any()):
            continue
        rot = _rotate_branch(parts, q, k, q_pos, k_pos, br, freqs, q_scale)
        s = rot.q @ rot.k.transpose(-1, -2)  # [B,H,nq,nk]
        if scores is None:
            scores = s if region is None else torch.where(region, s, torch.zeros_like(s))
        else:
            scores = torch.where(region, s, scores) if region is not None else s
    if scores is None:  # no pair in any region (cannot happen for a partition); keep shapes
        scores = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    scores = _softcap(parts, scores)
    if parts.bias is not None:
        scores = scores + parts.bias.score(
            torch.arange(parts.n_heads, device=q.device)[None, :, None, None],
            parts.bias_query_pos(qp, kp), kp).to(scores.dtype)
    return scores


def _finish(parts, scores, allowed, v, q, k, q_pos, k_pos, q_scale):
    if parts.relative is not None:
        scores = scores + parts.relative.scores(q, k, q_pos, k_pos, q_scale)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1)
    if not bool(allowed.any(dim=-1).all()):
        probs = torch.nan_to_num(probs, nan=0.0)  # rows with no visible key -> 0 output
    probs = probs.to(v.dtype)
    out = probs @ v
    if parts.relative is not None:
        extra = parts.relative.values(probs, q_pos, k_pos)
        if extra is not None:
            out = out + extra
    return out


def _reference(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask=None):
    scores = _scores_tile(parts, q, k, q_pos, k_pos, freqs, q_scale)
    allowed = parts.allowed(q_pos[:, None, :, None], k_pos[:, None, None, :])
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    return _finish(parts, scores, allowed, v, q, k, q_pos, k_pos, q_scale)


# ====================================================================== blockwise path
def _candidate_keys(key_intervals, qp_t, k_pos, keys_sorted: bool) -> torch.Tensor | None:
    """Indices of the keys a query tile may see according to ``key_intervals(q_lo, q_hi)`` (a mask's
    :meth:`~posenc.parts.masks.MaskSpec.key_intervals`), sorted and unique, or None for all keys. Needs
    key positions non-decreasing along each row."""
    if not keys_sorted or key_intervals is None:
        return None
    ivs = key_intervals(int(qp_t.min()), int(qp_t.max()))
    if ivs is None:
        return None
    Nk = k_pos.shape[1]
    bounds = torch.tensor([[lo, hi] for lo, hi in ivs], dtype=k_pos.dtype, device=k_pos.device)  # [I,2]
    vals = bounds.flatten()[None].expand(k_pos.shape[0], -1).contiguous()  # [B, 2I]
    k_pos = k_pos.contiguous()
    left = torch.searchsorted(k_pos, vals, right=False)[:, 0::2].min(dim=0).values  # [I]
    right = torch.searchsorted(k_pos, vals, right=True)[:, 1::2].max(dim=0).values
    pieces = [torch.arange(int(a), int(b), device=k_pos.device) for a, b in zip(left, right) if b > a]
    if not pieces:
        return k_pos.new_zeros(0)
    idx = torch.unique(torch.cat(pieces)) if len(pieces) > 1 else pieces[0]
    return None if idx.numel() == Nk else idx


def _keys_sorted(k_pos) -> bool:
    return k_pos.shape[1] < 2 or bool((k_pos[:, 1:] >= k_pos[:, :-1]).all())


def _blockwise(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask=None, tile: int = 256):
    """Query tiles of ``tile`` rows. Per tile: the keys its mask intervals allow (a window costs
    O(window), not O(N)); per branch: q and k rotated once for the whole call, and the q.k product
    computed only on the contiguous key columns its region reaches (ReRoPE's near branch touches
    ~window keys per tile, the far branch the rest; boundary columns are computed by both)."""
    B, H, Nq, D = q.shape
    out = torch.empty(B, H, Nq, v.shape[-1], dtype=v.dtype, device=v.device)
    k_pos = k_pos.contiguous()  # searched once per tile
    rots = [_rotate_branch(parts, q, k, q_pos, k_pos, br, freqs, q_scale) for br in parts.branches]
    keys_sorted = _keys_sorted(k_pos)
    heads = torch.arange(parts.n_heads, device=q.device)[None, :, None, None]
    for s in range(0, Nq, tile):
        e = min(Nq, s + tile)
        qp_t = q_pos[:, s:e]
        idx = _candidate_keys(parts.mask.key_intervals, qp_t, k_pos, keys_sorted)
        if idx is not None and idx.numel() == 0:
            out[:, :, s:e] = 0
            continue
        def sel(t, dim, idx=idx):
            return t if idx is None else t.index_select(dim, idx)

        kp_c = sel(k_pos, 1)
        qg, kg = qp_t[:, None, :, None], kp_c[:, None, None, :]
        allowed = parts.allowed(qg, kg)  # [B,1,t,nc]
        if key_mask is not None:
            allowed = allowed & sel(key_mask, 1)[:, None, None, :]
        scores = None
        for br, rot in zip(parts.branches, rots):
            q_b = rot.q[:, :, s:e]
            region = allowed if br.region is None else br.region(qg, kg) & allowed
            cols = region.any(dim=(0, 1, 2)).nonzero().flatten()
            if cols.numel() == 0:
                continue
            c0, c1 = int(cols[0]), int(cols[-1]) + 1
            k_b = sel(rot.k, 2)[:, :, c0:c1]
            s_b = q_b @ k_b.transpose(-1, -2)  # [B,H,t,c1-c0]
            if scores is None:
                scores = q_b.new_zeros(B, H, e - s, kp_c.shape[1])
            if br.region is None or bool(region[..., c0:c1].all()):
                scores[..., c0:c1] = s_b
            else:
                scores[..., c0:c1] = torch.where(region[..., c0:c1], s_b, scores[..., c0:c1])
        if scores is None:
            out[:, :, s:e] = 0
            continue
        scores = _softcap(parts, scores)
        if parts.bias is not None:
            scores = scores + parts.bias.score(heads, parts.bias_query_pos(qg, kg), kg).to(scores.dtype)
        q_t, qs_t = q[:, :, s:e], q_scale[:, :, s:e]
        out[:, :, s:e] = _finish(parts, scores, allowed, sel(v, 2), q_t, sel(k, 2), qp_t, kp_c, qs_t)
    return out


# ====================================================================== SDPA path
def sdpa_applicable(parts: AttentionParts) -> bool:
    """One branch and no content-relative terms: rotate once, then fused SDPA with the bias and
    mask as one additive mask (or ``is_causal``). This is the training path at short lengths."""
    return parts.single_branch and parts.relative is None and parts.scheme.softcap is None


def _sdpa(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask=None):
    import torch.nn.functional as F

    rot = _rotate_branch(parts, q, k, q_pos, k_pos, parts.branches[0], freqs, q_scale)
    Nq, Nk = q.shape[2], k.shape[2]
    plain = (parts.bias is None and key_mask is None and parts.mask.is_plain_causal
             and type(parts.remap).allowed is Remap.allowed and Nq == Nk
             and bool((q_pos == k_pos).all())
             and bool((q_pos == torch.arange(Nq, device=q_pos.device)[None] + q_pos[:, :1]).all()))
    if plain:  # positions are the indices (up to a shift): SDPA's own causal mask is the same mask
        return F.scaled_dot_product_attention(rot.q, rot.k, v, is_causal=True, scale=1.0)
    if key_mask is None and q_pos.shape[0] > 1 and bool((q_pos == q_pos[:1]).all() and (k_pos == k_pos[:1]).all()):
        q_pos, k_pos = q_pos[:1], k_pos[:1]  # every row alike: one [1,H,Nq,Nk] mask, broadcast over the batch
    qp, kp = q_pos[:, None, :, None], k_pos[:, None, None, :]
    allowed = parts.allowed(qp, kp)
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    if parts.bias is None:
        mask = allowed
    else:
        h = torch.arange(parts.n_heads, device=q.device)[None, :, None, None]
        bias = parts.bias.score(h, parts.bias_query_pos(qp, kp), kp).to(q.dtype)
        mask = bias.masked_fill(~allowed, float("-inf"))
    out = F.scaled_dot_product_attention(rot.q, rot.k, v, attn_mask=mask, scale=1.0)
    if not bool(allowed.any(dim=-1).all()):
        out = torch.nan_to_num(out, nan=0.0)
    return out


# ====================================================================== flex path
@lru_cache(maxsize=1)
def _compiled_flex():
    import torch._dynamo.config as dynamo_config
    from torch.nn.attention.flex_attention import flex_attention

    # One compiled callable serves every scheme; each distinct score_mod/mask_mod/shape family is a
    # graph in its cache. The default limit (8) would silently drop a lab run with many schemes
    # to eager flex, which materialises the scores.
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 256)
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 256)
    return torch.compile(flex_attention, dynamic=False)


def build_block_mask(allowed_fn, q_pos, k_pos, block: int = 128, key_intervals=None):
    """BlockMask for ``allowed_fn(qp, kp)`` built one query block row at a time, evaluating the mask
    only on the keys ``key_intervals(q_lo, q_hi)`` admits (all keys when None or when key positions
    are not sorted). Memory O(block x candidate keys); a sliding window costs O(N x window)."""
    from torch.nn.attention.flex_attention import BlockMask

    B, Nq = q_pos.shape
    Nk = k_pos.shape[1]
    nqb, nkb = (Nq + block - 1) // block, (Nk + block - 1) // block
    partial = torch.zeros(B, 1, nqb, nkb, dtype=torch.bool)
    full = torch.zeros(B, 1, nqb, nkb, dtype=torch.bool)
    keys_sorted = key_intervals is not None and _keys_sorted(k_pos)
    kidx_all = torch.arange(Nk)
    for i in range(nqb):
        s, e = i * block, min(Nq, (i + 1) * block)
        qp = q_pos[:, s:e]
        idx = _candidate_keys(key_intervals, qp, k_pos, keys_sorted)
        kidx = kidx_all if idx is None else idx
        if kidx.numel() == 0:
            continue
        a = allowed_fn(qp[:, :, None], k_pos.index_select(1, kidx)[:, None, :])  # [B,t,nc]
        blk = torch.div(kidx, block, rounding_mode="floor")  # key block of each candidate
        counts = torch.zeros(B, nkb, dtype=torch.long).index_add_(1, blk, a.sum(dim=1).long())
        sizes = torch.full((nkb,), block, dtype=torch.long)
        sizes[-1] = Nk - (nkb - 1) * block
        # "full" (mask_mod skipped) only for complete blocks whose every pair is visible
        allb = (counts == (e - s) * sizes[None]) & (sizes[None] == block) & (e - s == block)
        partial[:, 0, i] = (counts > 0) & ~allb
        full[:, 0, i] = allb

    def to_idx(m):
        num = m.sum(-1).to(torch.int32)
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num, order

    kv_num, kv_idx = to_idx(partial)
    f_num, f_idx = to_idx(full)
    qp_c, kp_c = q_pos.contiguous(), k_pos.contiguous()

    def mask_mod(b, h, qi, ki):
        return allowed_fn(qp_c[b, qi], kp_c[b, ki])

    return BlockMask.from_kv_blocks(kv_num, kv_idx, f_num, f_idx, BLOCK_SIZE=block, mask_mod=mask_mod,
                                    seq_lengths=(Nq, Nk))


# ====================================================================== banded branch merge (CPU flash + LSE)
def _position_run(q_pos, k_pos) -> int | None:
    """The first query position when keys sit at ``0..Nk-1`` and queries at a contiguous run
    ``q0..q0+Nq-1`` with ``q0 + Nq <= Nk``, identically in every row (a full forward, a prefill, or a
    decode step without padding); None otherwise. The fused CPU paths index keys by position."""
    Nq, Nk = q_pos.shape[1], k_pos.shape[1]
    if not bool((k_pos == k_pos[:1]).all() and (q_pos == q_pos[:1]).all()):
        return None
    q0 = int(q_pos[0, 0])
    ok = bool((k_pos[0] == torch.arange(Nk, device=k_pos.device)).all()) and q0 + Nq <= Nk and bool(
        (q_pos[0] == torch.arange(q0, q0 + Nq, device=q_pos.device)).all())
    return q0 if ok else None


def _fused_cpu_ok(q, v=None) -> bool:
    """The fused CPU flash kernel runs it: CPU, fp32/bf16, values as wide as queries (when given)."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16)
            and (v is None or v.shape[-1] == q.shape[-1])
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"))


def band_merge_applicable(parts: AttentionParts, q_pos, k_pos, key_mask, q, v=None) -> bool:
    """Two branches split at one distance ``w`` (ReRoPE, Leaky ReRoPE, SelfExtend, distance ceiling),
    nothing else in the scores, plain causal mask, positions ``0..Nk-1`` for keys and a contiguous
    run of them for queries (a full forward, a prefill, or one decode step), on CPU."""
    br = parts.branches
    if (len(br) != 2 or br[0].kind != "near" or br[1].kind != "far" or br[0].window != br[1].window
            or parts.bias is not None or parts.relative is not None or parts.scheme.softcap is not None
            or not parts.mask.is_plain_causal or type(parts.remap).allowed is not Remap.allowed
            or key_mask is not None or not _fused_cpu_ok(q, v)):
        return False
    return _position_run(q_pos, k_pos) is not None


def _band_merge(parts, q, k, v, q_pos, k_pos, freqs, q_scale):
    """Near branch (d < w) and far branch (d >= w) each computed by the fused CPU flash kernel on only
    the keys it covers (:func:`posenc.engine.toeplitz.toeplitz_attention` with a window, and with a minimum
    distance), merged by their rows' log-sum-exp. Nothing of size N x N is built; values are reversed
    once for both pieces."""
    from posenc.engine.toeplitz import toeplitz_attention

    w = parts.branches[0].window
    near, far = (_rotate_branch(parts, q, k, q_pos, k_pos, br, freqs, q_scale) for br in parts.branches)
    Nq = q.shape[2]
    q0 = int(q_pos[0, 0])
    vr = v.flip(2)
    zeros = _distance_profile(parts, q0 + Nq, q.device)  # no bias on this path: zeros
    o_near, l_near = toeplitz_attention(near.q, near.k.flip(2), vr, zeros, q_start=q0, window=w,
                                        return_lse=True, reversed_keys=True)
    if q0 + Nq <= w:  # no query reaches the far branch
        return o_near
    o_far, l_far = toeplitz_attention(far.q, far.k.flip(2), vr, zeros, q_start=q0, min_distance=w,
                                      return_lse=True, reversed_keys=True)
    # weights exp(l_i) / (exp(l_near) + exp(l_far)): the far one is sigmoid(l_far - l_near) (l_near is finite,
    # every row sees its own key; l_far = -inf gives 0), and one fused lerp merges in place
    w_far = torch.sigmoid(l_far - l_near)[..., None].to(o_near.dtype)
    return o_near.lerp_(o_far, w_far)


# ====================================================================== Toeplitz bias on the CPU flash kernel
TOEPLITZ_MIN_QUERIES = 64  # below this (decode steps) a materialised [B,H,Nq,Nk] mask is as cheap


def _fixed_distance_bias(parts: AttentionParts) -> bool:
    """No bias, or one that depends only on the distance and needs no gradient here (its table can be
    read once as a profile)."""
    bias = parts.bias
    return bias is None or (bias.translation_invariant and not (
        torch.is_grad_enabled() and any(p.requires_grad for p in bias.parameters())))


def _distance_profile(parts: AttentionParts, reach: int, device) -> torch.Tensor:
    """``[H, reach]`` bias at distances ``0..reach-1`` (zeros without a bias)."""
    if parts.bias is None:
        return torch.zeros(parts.n_heads, reach, dtype=torch.float32, device=device)
    return parts.bias.distance_profile(reach, device=device)


def toeplitz_applicable(parts: AttentionParts, q_pos, k_pos, key_mask, q, needs_grad: bool, v=None) -> bool:
    """One branch, a bias (if any) that depends only on the distance (``translation_invariant``) and needs no
    gradient, a causal mask with at most a sliding window (no sinks, no blocks), nothing else in the
    scores, contiguous positions (:func:`_position_run`), on CPU. Gradients reach q, k and v through the
    flash kernel's backward (ALiBi training). Plain causal attention without a bias is SDPA's."""
    bias = parts.bias
    mask = parts.mask
    if (not parts.single_branch or parts.relative is not None or parts.scheme.softcap is not None
            or type(parts.remap).allowed is not Remap.allowed or type(parts.remap).relative is not Remap.relative
            or not mask.causal or mask.n_sinks or mask.block is not None or key_mask is not None
            or not _fused_cpu_ok(q, v)):
        return False
    if (bias is None and mask.window is None) or not _fixed_distance_bias(parts):
        return False  # (a learned table's gradient would have to flow through the strided view)
    return _position_run(q_pos, k_pos) is not None


def _toeplitz(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask=None):
    """Rotate once, then :func:`posenc.engine.toeplitz.toeplitz_attention`: the bias's distance profile (and the
    window) as a strided O(N) view read by the fused CPU flash kernel."""
    from posenc.engine.toeplitz import toeplitz_attention

    rot = _rotate_branch(parts, q, k, q_pos, k_pos, parts.branches[0], freqs, q_scale)
    q0 = int(q_pos[0, 0])
    window = parts.mask.window
    reach = q0 + q.shape[2] if window is None else min(window, q0 + q.shape[2])
    return toeplitz_attention(rot.q, rot.k, v, _distance_profile(parts, reach, q.device), q_start=q0, window=window)


# ====================================================================== attention sinks + window (two pieces, LSE)
def _window_branch(parts: AttentionParts, q0: int, Nq: int) -> int | None:
    """Index of a branch whose region holds every pair of the window piece (``max(s, m - w + 1) <= n <= m``
    for the queries ``q0..q0+Nq-1``), or None. Evaluated on that band once per shape and memoised:
    regions are arbitrary elementwise functions, so this is checked, not assumed."""
    key = (q0, Nq)
    memo = parts.__dict__.setdefault("_window_branch_memo", {})
    if key not in memo:
        s, w = parts.mask.n_sinks, parts.mask.window
        rows = max(1, (1 << 22) // w)  # band evaluated in blocks of ~4M pairs

        def holds(region) -> bool:
            for a in range(q0, q0 + Nq, rows):
                qp = torch.arange(a, min(q0 + Nq, a + rows))[:, None]  # [r,1]
                kp = qp - torch.arange(w)[None]  # [r,w] the band, d = 0..w-1
                if not bool((region(qp, kp) | (kp < s)).all()):
                    return False
            return True

        found = next((i for i, br in enumerate(parts.branches) if br.region is None or holds(br.region)), None)
        if len(memo) > 64:
            memo.clear()
        memo[key] = found
    return memo[key]


def sinks_window_applicable(parts: AttentionParts, q_pos, k_pos, key_mask, q, needs_grad: bool, v=None) -> bool:
    """A causal window (with or without attention sinks) whose window pairs all fall in one branch
    (StreamingLLM's re-indexing, LM-Infinite's distance ceiling, a window under a ReRoPE-like remap),
    a distance-only bias or none, nothing else in the scores, contiguous positions, inference on CPU.
    The window piece runs on the Toeplitz kernel, the sinks piece (n_sinks keys) is materialised."""
    mask, bias = parts.mask, parts.bias
    if (mask.window is None or not mask.causal or mask.block is not None or parts.relative is not None
            or parts.scheme.softcap is not None or type(parts.remap).allowed is not Remap.allowed
            or key_mask is not None or needs_grad or not _fused_cpu_ok(q, v)):
        return False
    if not _fixed_distance_bias(parts) or (bias is not None and type(parts.remap).relative is not Remap.relative):
        return False
    q0 = _position_run(q_pos, k_pos)
    return q0 is not None and _window_branch(parts, q0, q_pos.shape[1]) is not None


def _sinks_window(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask=None):
    """Window piece (keys ``>= n_sinks`` within the window, one branch, Toeplitz kernel) and sinks piece
    (keys ``< n_sinks``, any branch mix, scored like the reference path), merged by log-sum-exp."""
    from posenc.engine.toeplitz import toeplitz_attention

    s, w = parts.mask.n_sinks, parts.mask.window
    Nq = q.shape[2]
    q0 = int(q_pos[0, 0])
    rot = _rotate_branch(parts, q, k, q_pos, k_pos, parts.branches[_window_branch(parts, q0, Nq)], freqs, q_scale)
    profile = _distance_profile(parts, min(w, q0 + Nq), q.device)
    o_win, l_win = toeplitz_attention(rot.q, rot.k, v, profile, q_start=q0, window=w, key_start=s, return_lse=True)
    ks = min(s, k.shape[2])
    if ks == 0:
        return o_win
    kp_s = k_pos[:, :ks]
    scores = _scores_tile(parts, q, k[:, :, :ks], q_pos, kp_s, freqs, q_scale)  # [B,H,Nq,ks]
    allowed = parts.allowed(q_pos[:, None, :, None], kp_s[:, None, None, :])
    scores = scores.float().masked_fill(~allowed, float("-inf"))
    l_sink = torch.logsumexp(scores, dim=-1)  # [B,H,Nq]; -inf where no sink is visible
    probs = torch.nan_to_num(torch.exp(scores - l_sink[..., None]), nan=0.0)
    o_sink = probs.to(v.dtype) @ v[:, :, :ks]
    total = torch.logaddexp(l_win, l_sink)  # every query sees itself in one of the pieces: finite
    w_sink = torch.exp(l_sink - total)[..., None].to(o_win.dtype)  # rows before n_sinks: l_win = -inf, w = 1
    return o_win.lerp_(o_sink.to(o_win.dtype), w_sink)


def flex_applicable(parts: AttentionParts, needs_grad: bool) -> bool:
    return (parts.single_branch and parts.relative is None and not needs_grad
            and (parts.bias is None or not any(p.requires_grad for p in parts.bias.parameters())
                 or not torch.is_grad_enabled()))


FLEX_BLOCK = 128  # the block size of the block masks and of the compiled kernel


def _pad_to_block(n: int) -> int:
    return -(-n // FLEX_BLOCK) * FLEX_BLOCK


def _flex(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask=None):
    """Compiled FlexAttention with the queries and keys padded to whole 128-token blocks.

    Why the padding: in torch 2.13, compiled CPU ``flex_attention`` gives wrong, run-to-run different
    answers whenever a query or key length leaves a block shorter than 128 (it reads past the valid
    rows of the last block: uninitialised memory). Minimal reproduction, no posenc involved::

        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        q, k, v = (torch.randn(1, 1, 40, 16) for _ in range(3))
        bm = create_block_mask(lambda b, h, i, j: j <= i, 1, 1, 40, 40, device="cpu")
        out = torch.compile(flex_attention)(q, k, v, block_mask=bm)
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        (out - ref).abs().max()  # 0.8-1.9 here, and a different value in each process

    (also with Nq < Nk, e.g. 5 queries after a 51-token prefix). So Nq and Nk are padded independently
    to multiples of 128: padded keys get position -1, which the mask refuses (the same encoding as
    padding keys from ``key_mask``); padded queries repeat the last query position and are dropped from
    the output. Every block the kernel sees is then complete. Positions, not indices, carry the query
    offset, so a decode step or a prefix stays right."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    Pq, Pk = _pad_to_block(Nq) - Nq, _pad_to_block(Nk) - Nk
    rot = _rotate_branch(parts, q, k, q_pos, k_pos, parts.branches[0], freqs, q_scale)
    if key_mask is not None:  # padding keys: encode validity in the key position (-1 is never a real position)
        k_pos = torch.where(key_mask, k_pos, torch.full_like(k_pos, -1))
    qp = torch.cat([q_pos, q_pos[:, -1:].expand(B, Pq)], dim=1)
    kp = torch.cat([k_pos, k_pos.new_full((B, Pk), -1)], dim=1)
    if key_mask is None and Pk == 0:
        bm = build_block_mask(parts.allowed, qp, kp, key_intervals=parts.mask.key_intervals)
    else:
        bm = build_block_mask(lambda a, b: parts.allowed(a, b) & (b >= 0), qp, kp)

    def pad(t, n):
        return torch.cat([t, t.new_zeros(B, H, n, t.shape[-1])], dim=2) if n else t.contiguous()

    score_mod = _flex_score_mod(parts, qp.contiguous(), kp.contiguous())
    # the softmax scale is already folded into q; compiled once per padded shape
    key = (parts.scheme.to_json(), (B, H, Nq + Pq, D), (B, H, Nk + Pk, v.shape[-1]), q.dtype, key_mask is None)
    first = key not in _FLEX_SEEN
    if first:  # torch.compile specialises on shapes: say so before the wait (seconds), not after
        _FLEX_SEEN.add(key)
        log.info("compiling FlexAttention for %s, %d x %d tokens (first call of this shape; later calls reuse it)",
                 parts.scheme.name or "this scheme", Nq, Nk)
        t0 = time.perf_counter()
    out = _compiled_flex()(pad(rot.q, Pq), pad(rot.k, Pk), pad(v, Pk), score_mod=score_mod, block_mask=bm,
                           scale=1.0)
    if first:
        log.info("FlexAttention ready in %.1f s", time.perf_counter() - t0)
    return out[:, :, :Nq]


def _flex_score_mod(parts, qp_c, kp_c):
    """The scheme's soft-cap and bias as a flex ``score_mod`` over padded positions, or None."""
    cap, bias = parts.scheme.softcap, parts.bias
    if bias is None and cap is None:
        return None

    def score_mod(score, b, h, qi, ki):
        if cap is not None:
            score = torch.tanh(score / cap) * cap
        if bias is None:
            return score
        qp, kp = qp_c[b, qi], kp_c[b, ki]
        return score + bias.score(h, parts.bias_query_pos(qp, kp), kp).to(score.dtype)

    return score_mod


_FLEX_SEEN: set = set()  # (scheme, shapes, dtype, padding) already run by the compiled flex callable


# ====================================================================== entry point
SDPA_MASK_ELEMENTS = 1 << 26  # largest materialised additive mask the auto choice accepts (256 MB fp32)


def choose_impl(parts: AttentionParts, B: int, H: int, Nq: int, Nk: int, needs_grad: bool) -> str:
    """The path ``impl="auto"`` takes (measured on this CPU, see benchmarks/):

    - single branch, no content-relative terms: fused SDPA (its causal kernel needs no mask at all;
      a bias or window becomes one additive mask while that stays below SDPA_MASK_ELEMENTS);
    - beyond that, at inference: compiled FlexAttention (score_mod + block mask, linear memory);
    - overriding both for at least TOEPLITZ_MIN_QUERIES queries: distance-only biases and causal sliding
      windows on the fused CPU flash kernel (``toeplitz``, also for training fixed biases), and at
      inference attention sinks + window (``sinks``); decided in :func:`run_attention` because both
      need the positions;
    - multi-branch remaps whose regions are distance bands (ReRoPE, Leaky ReRoPE, SelfExtend,
      distance ceiling) on a plain causal mask: the fused CPU flash kernel per branch, merged by
      log-sum-exp ("band", reached through ``flex``);
    - other multi-branch remaps, content-relative terms: the materialised reference when it is small
      or gradients are needed, else the blockwise path (linear memory).
    """
    if sdpa_applicable(parts):
        plain = parts.bias is None and parts.mask.is_plain_causal and type(parts.remap).allowed is Remap.allowed
        if plain or B * H * Nq * Nk <= SDPA_MASK_ELEMENTS or needs_grad:
            return "sdpa"
        if flex_applicable(parts, needs_grad):
            return "flex"
    if needs_grad:
        return "reference"
    return "flex" if Nq * Nk > 256 * 256 else "reference"  # flex: band merge or blockwise for these

def run_attention(parts: AttentionParts, q, k, v, q_pos=None, k_pos=None, impl: str = "auto",
                  scale: float | None = None, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of un-rotated ``q [B,H,Nq,D]`` over ``k, v [B,Hk,Nk,D]`` under ``parts``.
    ``key_mask [B,Nk]`` (bool, True = real token) removes padding keys. On every path: a query that
    sees no key (all its keys padding or masked) gets a 0 output row, and a query row holding NaN or inf
    gets a NaN output row (NaN in, NaN out). ``scale``: the softmax scale, finite and > 0 (default
    ``1/sqrt(D)``)."""
    scale = check_inputs(q, k, v, impl, scale, key_mask)
    B, H, Nq, D = q.shape
    if (H, D) != (parts.n_heads, parts.head_dim):
        raise ValueError(f"q must have {parts.n_heads} heads of head_dim {parts.head_dim} (the layer's), got {H}, {D}")
    Nk = k.shape[2]
    if q_pos is None and Nq > Nk:
        raise ValueError(f"q has more tokens ({Nq}) than k ({Nk}): pass q_pos (default: the last Nq key positions)")
    q_pos = as_positions(q_pos if q_pos is not None else torch.arange(Nk - Nq, Nk), B, Nq, q.device)
    k_pos = as_positions(k_pos, B, Nk, k.device)
    out = _dispatch(parts, q, k, v, q_pos, k_pos, impl, scale, key_mask)
    bad = ~torch.isfinite(q).all(dim=-1)  # [B,H,Nq]: NaN/inf in a query row gives a NaN output row, on every path
    if bool(bad.any()):
        out = out.masked_fill(bad[..., None], float("nan"))
    return out


def check_inputs(q, k, v, impl, scale, key_mask) -> float | None:
    """Refuse what the engine cannot compute, with the argument and the allowed values in the message;
    return ``scale`` as a float (or None)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D [batch, heads, tokens, head_dim], got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t.dtype != q.dtype or t.device != q.device:
            raise TypeError(f"{name} must have q's dtype and device ({q.dtype}, {q.device}), got {t.dtype}, {t.device}")
        if min(t.shape) == 0:
            raise ValueError(f"{name} must have batch, heads, tokens and head_dim >= 1, got shape {tuple(t.shape)}")
    B, H, _, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"k and v must have q's batch size {B}, got k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[1] != v.shape[1] or H % k.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, dividing q's {H} heads (GQA); "
                         f"got k {k.shape[1]}, v {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same number of tokens, got k {k.shape[2]}, v {v.shape[2]}")
    if k.shape[3] != D:
        raise ValueError(f"k must have q's head_dim {D}, got {k.shape[3]}")
    if key_mask is not None:
        if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must be a bool tensor (True = real token), got "
                            f"{getattr(key_mask, 'dtype', type(key_mask).__name__)}")
        if tuple(key_mask.shape) != (B, k.shape[2]):
            raise ValueError(f"key_mask must have shape [batch, keys] = {(B, k.shape[2])}, got {tuple(key_mask.shape)}")
    return None if scale is None else check_finite("scale", scale, minimum=0.0, strict_min=True)


def _dispatch(parts, q, k, v, q_pos, k_pos, impl, scale, key_mask):
    """Pick the path for ``impl`` (see :func:`choose_impl`) and run it, per dynamic-schedule group."""
    B, H, Nq, _ = q.shape
    Nk = k.shape[2]
    k, v = _expand_kv(k, H), _expand_kv(v, H)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if impl == "auto":
        impl = choose_impl(parts, B, H, Nq, Nk, needs_grad)
        if impl in ("sdpa", "flex") and Nq >= TOEPLITZ_MIN_QUERIES:
            if toeplitz_applicable(parts, q_pos, k_pos, key_mask, q, needs_grad, v):
                impl = "toeplitz"
            elif sinks_window_applicable(parts, q_pos, k_pos, key_mask, q, needs_grad, v):
                impl = "sinks"
    elif impl == "toeplitz" and not toeplitz_applicable(parts, q_pos, k_pos, key_mask, q, needs_grad, v):
        impl = choose_impl(parts, B, H, Nq, Nk, needs_grad)
    if impl == "flex" and not flex_applicable(parts, needs_grad):
        # multi-branch remaps: merge branches by LSE with the fused CPU flash kernel where the regions are
        # bands in distance; otherwise (and for backward) the blockwise path
        if not needs_grad and band_merge_applicable(parts, q_pos, k_pos, key_mask, q, v):
            impl = "band"
        elif sinks_window_applicable(parts, q_pos, k_pos, key_mask, q, needs_grad, v):
            impl = "sinks"
        else:
            impl = "blockwise"
    if impl == "sdpa" and not sdpa_applicable(parts):
        impl = "blockwise"
    path = {"reference": _reference, "sdpa": _sdpa, "blockwise": _blockwise, "flex": _flex,
            "band": lambda *a: _band_merge(*a[:-1]), "toeplitz": _toeplitz, "sinks": _sinks_window}[impl]

    ells = parts.schedule_lengths(q_pos, k_pos)
    if ells is None:
        freqs = parts.frequencies(None) if parts.rope is not None else None
        attn_scale = freqs.attention_scale if freqs is not None else 1.0
        q_scale = _query_scale(parts, q_pos, attn_scale, q.dtype, scale)
        return path(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask)

    # dynamic schedule: queries grouped by the length their schedule sees (few groups in practice)
    out = None
    for ell in torch.unique(ells).tolist():
        freqs = parts.frequencies(int(ell))
        q_scale = _query_scale(parts, q_pos, freqs.attention_scale, q.dtype, scale)
        sel = ells == ell  # [B,Nq]
        if bool((sel == sel[:1]).all()):  # same queries in every row: compute only those
            idx = sel[0].nonzero().flatten()
            o = path(parts, q.index_select(2, idx), k, v, q_pos.index_select(1, idx), k_pos, freqs,
                     q_scale.index_select(2, idx), key_mask)
            if out is None:
                out = torch.zeros(B, H, Nq, v.shape[-1], dtype=o.dtype, device=o.device)
            out = out.index_copy(2, idx, o)
        else:
            o = path(parts, q, k, v, q_pos, k_pos, freqs, q_scale, key_mask)
            out = o if out is None else torch.where(sel[:, None, :, None], o, out)
    return out


def attention(q, k, v, scheme: PositionScheme, q_pos=None, k_pos=None, impl: str = "auto",
              scale: float | None = None, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Functional attention for parameter-free schemes (RoPE and its extensions, ALiBi, masks,
    remaps): ``q [B,H,Nq,D]``, ``k, v [B,Hk,Nk,D]`` un-rotated; positions default to the last Nq of
    0..Nk-1. Returns ``[B,H,Nq,D]``. Schemes with learned parts need :class:`PositionalAttention`."""
    if not isinstance(scheme, PositionScheme):
        raise ValueError(f"scheme must be a PositionScheme, got {type(scheme).__name__}")
    check_inputs(q, k, v, impl, scale, key_mask)
    parts = _parts_for(scheme.to_json(), q.shape[1], q.shape[-1])
    return run_attention(parts, q, k, v, q_pos, k_pos, impl=impl, scale=scale, key_mask=key_mask)


class PositionalAttention(nn.Module):
    """Multi-head attention (q/k/v/o projections) that executes any :class:`PositionScheme`,
    including its learned parts (T5 table, KERPLE r1/r2, Shaw/XL/DeBERTa tables, Infini gate).

    ``forward(x [B,N,dim], positions=None, impl="auto", cache=None, layer=None, memory=None)``.
    """

    def __init__(self, dim: int, n_heads: int, scheme: PositionScheme, n_kv_heads: int | None = None,
                 bias: bool = False):
        super().__init__()
        dim, n_heads = check_positive_int("dim", dim), check_positive_int("n_heads", n_heads)
        if dim % n_heads:
            raise ValueError(f"dim ({dim}) must be divisible by n_heads ({n_heads})")
        n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
        if n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
        self.dim, self.n_heads = dim, n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = dim // n_heads
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=bias)
        self.parts = AttentionParts(scheme, n_heads, self.head_dim)
        self.memory = None
        if scheme.memory is not None:
            from posenc.parts.memory import MEMORIES

            if scheme.memory.kind not in MEMORIES:
                raise ValueError(f"unknown memory {scheme.memory.kind!r}; known: {sorted(MEMORIES)}")
            memory_cls = MEMORIES[scheme.memory.kind]  # None: the memory lives in the model (XL recurrence)
            if memory_cls is not None:
                self.memory = memory_cls(n_heads, self.head_dim, **scheme.memory.params)

    @property
    def scheme(self) -> PositionScheme:
        return self.parts.scheme

    def project(self, x):
        B, N, _ = x.shape
        q = self.q_proj(x).view(B, N, self.n_heads, self.head_dim).transpose(1, 2)  # [B,H,N,D]
        k = self.k_proj(x).view(B, N, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B,Hk,N,D]
        v = self.v_proj(x).view(B, N, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def forward(self, x, positions=None, impl: str = "auto", cache=None, layer: int | None = None,
                context=None, key_mask=None):
        """``context``: optional ``(k_ctx, v_ctx, pos_ctx)`` extra keys placed before x's keys
        (Transformer-XL's gradient-stopped memory); ``cache``/``layer``: a posenc KV cache whose
        ``update`` returns all keys, values, positions and validity; ``key_mask [B,N]``: False for
        padding tokens of x."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be a [batch, tokens, {self.dim}] tensor, got {getattr(x, 'shape', type(x))}")
        B, N, _ = x.shape
        positions = as_positions(positions, B, N, x.device)
        q, k, v = self.project(x)
        if self.memory is not None:
            out = self.memory(q, k, v, positions, lambda *a, **kw: run_attention(self.parts, *a, impl=impl, **kw))
        else:
            k_pos = positions
            if context is not None:
                kc, vc, pc = context
                k, v = torch.cat([kc, k], dim=2), torch.cat([vc, v], dim=2)
                k_pos = torch.cat([pc, positions], dim=1)
            if cache is not None:
                k, v, k_pos, key_mask = cache.update(layer, k, v, positions, key_mask, self.parts)
            out = run_attention(self.parts, q, k, v, positions, k_pos, impl=impl, key_mask=key_mask)
        out = out.transpose(1, 2).reshape(B, N, self.dim)  # [B,N,H*D]
        return self.o_proj(out)
