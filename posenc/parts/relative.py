"""Content-relative part: extra q.r / r.k score terms and value terms (trained-in schemes).

Each part is an ``nn.Module`` with

- ``score_scale``: multiplier of the usual 1/sqrt(D) (DeBERTa divides by sqrt(3 D));
- ``scores(q, k, q_pos, k_pos, scale) -> [B,H,Nq,Nk]`` extra logits, ``q [B,H,Nq,D]`` and
  ``k [B,H,Nk,D]`` the un-rotated projections and ``scale [B,1,Nq,1]`` the engine's query scale;
- ``values(probs, q_pos, k_pos) -> [B,H,Nq,D] | None`` added to the attention output;
- ``logits(scores, allowed, q, k, q_pos, k_pos, scale)``: the scores with the part's terms, what the
  engine calls; ``scores + self.scores(...)`` unless the terms read the logits themselves (CoPE).

Terms are computed from per-distance tables and gathered, so a tile of queries against the keys it
sees costs O(tile x keys) memory: the blockwise engine runs these schemes at long lengths.

Conventions (relative distance r = kp - qp, as in Shaw and T5; XL uses qp - kp >= 0):

- Shaw et al. 2018 (arXiv 1803.02155): e_ij = q_i.(k_j + a^K_{clip(r,-K,K)}),
  z_i = sum_j alpha_ij (v_j + a^V_{clip(r,-K,K)}); tables shared across heads as in the paper.
- Transformer-XL, Dai et al. 2019 (arXiv 1901.02860): A_ij = q_i.k_j + q_i.W_R R_{i-j} + u.k_j
  + v.W_R R_{i-j}; R sinusoidal (not learned), W_R, u, v learned per head.
- DeBERTa, He et al. 2021 (arXiv 2006.03654): A_ij = Q^c_i.K^c_j + Q^c_i.K^r_{delta(i,j)}
  + K^c_j.Q^r_{delta(j,i)}, scaled by 1/sqrt(3d); delta(i,j) = clip(i - j, -k, k - 1) + k
  (2k buckets). Per-head position tables stand in for P W_{q,r}, P W_{k,r} (same function class).
- CoPE, Golovneva et al. 2024 (arXiv 2405.18719): gates g_ij = sigmoid(logit_ij), contextual positions
  p_ij = sum_{t=j..i} g_it, e_ij = q_i . e[p_ij] interpolated; see :class:`CoPE`.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from posenc._util import check_positive_int
from posenc.parts.absolute import sinusoidal_encoding


def _gather_rel(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """table [B,H,Nq,R], idx [B,1|H,Nq,Nk] long -> [B,H,Nq,Nk]."""
    B, H, Nq, _ = table.shape
    return table.gather(-1, idx.expand(B, H, Nq, idx.shape[-1]))


class RelativePart(nn.Module):
    score_scale: float = 1.0

    def scores(self, q, k, q_pos, k_pos, scale):  # pragma: no cover - interface
        raise NotImplementedError

    def values(self, probs, q_pos, k_pos):
        return None

    def logits(self, scores, allowed, q, k, q_pos, k_pos, scale):
        """``scores [B,H,Nq,Nk]`` (scaled q.k, soft-cap and bias, before the mask ``allowed``) with this
        part's terms added."""
        return scores + self.scores(q, k, q_pos, k_pos, scale)


class ShawRelative(RelativePart):
    """Shaw et al. 2018 (arXiv 1803.02155): clipped relative key and value embeddings.

    ``e_ij = q_i . (k_j + a^K_{clip(r, -K, K)})`` and ``z_i = sum_j alpha_ij (v_j + a^V_{clip(r, -K, K)})``
    with ``r = kp - qp`` and ``K = max_distance``. Tables ``key_table``/``value_table [2K+1, D]`` are
    shared across heads as in the paper; ``a^V`` starts at zero. ``scores`` -> ``[B,H,Nq,Nk]``,
    ``values`` -> ``[B,H,Nq,D]``.
    """

    def __init__(self, n_heads: int, head_dim: int, max_distance: int = 16):
        super().__init__()
        self.max_distance = check_positive_int("shaw.max_distance", max_distance)
        n = 2 * self.max_distance + 1
        self.key_table = nn.Parameter(torch.randn(n, head_dim) * head_dim ** -0.5)  # a^K
        self.value_table = nn.Parameter(torch.zeros(n, head_dim))  # a^V

    def _idx(self, q_pos, k_pos):
        r = (k_pos[:, None, None, :] - q_pos[:, None, :, None]).clamp(-self.max_distance, self.max_distance)
        return r + self.max_distance  # [B,1,Nq,Nk]

    def scores(self, q, k, q_pos, k_pos, scale):
        qa = (q * scale) @ self.key_table.t().to(q.dtype)  # [B,H,Nq,2K+1]
        return _gather_rel(qa, self._idx(q_pos, k_pos))

    def values(self, probs, q_pos, k_pos):
        B, H, Nq, Nk = probs.shape
        idx = self._idx(q_pos, k_pos).expand(B, H, Nq, Nk)
        buckets = probs.new_zeros(B, H, Nq, self.value_table.shape[0]).scatter_add(-1, idx, probs)
        return buckets @ self.value_table.to(probs.dtype)  # [B,H,Nq,D]


class TransformerXLRelative(RelativePart):
    """Transformer-XL relative attention, Dai et al. 2019 (arXiv 1901.02860, sec. 3.3).

    ``A_ij = q_i . k_j + q_i . W_R R_{i-j} + u . k_j + v . W_R R_{i-j}`` (terms a-d); this part returns
    (b) + (c) + (d), the engine adds (a). ``R_d`` is the sinusoidal encoding of the distance
    ``d = max(qp - kp, 0)`` (sin | cos halves, not learned); ``W_R [H, D, D]``, ``u``, ``v [H, D]`` are learned
    per head. ``scores`` -> ``[B,H,Nq,Nk]``; no value term.
    """

    def __init__(self, n_heads: int, head_dim: int, base: float = 10000.0):
        super().__init__()
        self.n_heads, self.head_dim, self.base = n_heads, head_dim, base
        self.w_r = nn.Parameter(torch.randn(n_heads, head_dim, head_dim) * head_dim ** -0.5)
        self.u = nn.Parameter(torch.zeros(n_heads, head_dim))
        self.v = nn.Parameter(torch.zeros(n_heads, head_dim))

    def _r(self, max_d: int, dtype, device):
        """W_R R_d for d = 0..max_d: [H, max_d+1, D]; R_d sinusoidal (XL's order: sin | cos)."""
        d = torch.arange(max_d + 1, device=device)
        pe = sinusoidal_encoding(d, self.head_dim, self.base, torch.float64).unflatten(-1, (-1, 2))  # [M,D/2,(sin,cos)]
        R = torch.cat([pe[..., 0], pe[..., 1]], dim=-1).to(dtype)  # [M, D]: sin | cos halves
        return torch.einsum("md,hde->hme", R, self.w_r.to(dtype))

    def scores(self, q, k, q_pos, k_pos, scale):
        dist = (q_pos[:, None, :, None] - k_pos[:, None, None, :]).clamp(min=0)  # [B,1,Nq,Nk]
        max_d = int(dist.max()) if dist.numel() else 0
        r = self._r(max_d, q.dtype, q.device)  # [H,M,D]
        qv = (q + self.v[None, :, None, :].to(q.dtype)) * scale  # [B,H,Nq,D]
        pos_term = _gather_rel(torch.einsum("bhqd,hmd->bhqm", qv, r), dist)
        uk = torch.einsum("hd,bhkd->bhk", self.u.to(k.dtype), k)[:, :, None, :] * scale  # [B,H,Nq,Nk]
        return pos_term + uk


class DebertaRelative(RelativePart):
    """DeBERTa's disentangled attention, He et al. 2021 (arXiv 2006.03654, sec. 3.1).

    ``A_ij = Q^c_i . K^c_j + Q^c_i . K^r_{delta(i,j)} + K^c_j . Q^r_{delta(j,i)}``, scaled by
    ``1/sqrt(3 D)`` (``score_scale``), with ``delta(i,j) = clip(i - j, -k, k - 1) + k`` (``k = max_distance``,
    2k buckets). This part returns the content-to-position and position-to-content terms; per-head tables
    ``k_rel``/``q_rel [H, 2k, D]`` stand in for ``P W_{k,r}``/``P W_{q,r}``. ``scores`` -> ``[B,H,Nq,Nk]``.
    """

    score_scale = 1.0 / math.sqrt(3.0)

    def __init__(self, n_heads: int, head_dim: int, max_distance: int = 64):
        super().__init__()
        self.k_span = check_positive_int("deberta.max_distance", max_distance)
        n = 2 * self.k_span
        self.k_rel = nn.Parameter(torch.randn(n_heads, n, head_dim) * head_dim ** -0.5)  # K^r
        self.q_rel = nn.Parameter(torch.randn(n_heads, n, head_dim) * head_dim ** -0.5)  # Q^r

    def _delta(self, a, b):
        return (a - b).clamp(-self.k_span, self.k_span - 1) + self.k_span

    def scores(self, q, k, q_pos, k_pos, scale):
        qp, kp = q_pos[:, None, :, None], k_pos[:, None, None, :]
        c2p = _gather_rel((q * scale) @ self.k_rel.transpose(-1, -2).to(q.dtype)[None], self._delta(qp, kp))
        # p2c: k_j . Q^r_{delta(j,i)}: table [B,H,Nk,2k] -> transpose to index by query
        kq = k @ self.q_rel.transpose(-1, -2).to(k.dtype)[None]  # [B,H,Nk,2k]
        idx = self._delta(kp, qp)  # [B,1,Nq,Nk]
        B, H, Nk, R = kq.shape
        p2c = kq.transpose(2, 3).gather(2, idx.expand(B, H, idx.shape[2], Nk))
        # kq.transpose: [B,H,R,Nk]; gather along R with [B,H,Nq,Nk] -> [B,H,Nq,Nk]
        return c2p + p2c * scale


class CoPE(RelativePart):
    """Contextual Position Encoding, Golovneva et al. 2024 (arXiv 2405.18719, sec. 3 and appendix B).

    Positions count the keys the query finds relevant, not tokens. With ``z_ij`` the attention logit of
    the pair (scaled q.k plus soft-cap and bias, i.e. everything the engine has added so far) and the
    mask applied (a masked pair has gate 0)::

        g_ij = sigmoid(z_ij)              p_ij = min(sum_{t=j..i} g_it, npos_max - 1)
        w = p_ij - floor(p_ij)            e_ij = w q_i.e[ceil p_ij] + (1 - w) q_i.e[floor p_ij]
        logit_ij = z_ij + e_ij

    The sum runs over the
    visible keys from j up to the query, in key order: key positions must not decrease along a row (a
    posenc KV cache and a full forward keep them sorted; other orders raise ``ValueError``).
    ``q_i`` is the query projection as the layer made it, before the softmax scale (as the paper's code and
    x-transformers' ``CoPE``; a CoPE preset has no rotation, with one the un-rotated query is used).
    ``e [npos_max, D]`` (``pos_emb``) is shared by the heads and starts at zero, as in the paper.

    Memory: the gates and positions are a ``[B, H, Nq, Nk]`` tensor per call, like the materialised
    scores: CoPE runs on the ``reference`` and ``blockwise`` backends only (``blockwise`` bounds it to a
    query tile x the keys it sees), never on the fused kernels, which keep no score matrix.
    """

    def __init__(self, n_heads: int, head_dim: int, npos_max: int = 64):
        super().__init__()
        self.npos_max = check_positive_int("cope.npos_max", npos_max, minimum=2)
        self.pos_emb = nn.Parameter(torch.zeros(self.npos_max, head_dim))

    def logits(self, scores, allowed, q, k, q_pos, k_pos, scale):
        if k_pos.shape[1] > 1 and not bool((k_pos[:, 1:] >= k_pos[:, :-1]).all()):
            raise ValueError("CoPE counts the keys between a key and its query in key order: key positions "
                             "must not decrease along a row")
        gates = torch.sigmoid(scores.float()).masked_fill(~allowed, 0.0)  # [B,H,Nq,Nk]
        pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)  # sum over keys t >= j
        floor = pos.floor()
        w = pos - floor
        table = q.float() @ self.pos_emb.float().t()  # [B,H,Nq,npos_max]: q_i . e[p] at integer p
        lo = table.gather(-1, floor.long())
        hi = table.gather(-1, pos.ceil().long())
        return scores + (hi * w + lo * (1 - w)).to(scores.dtype)

    def extra_repr(self) -> str:
        return f"npos_max={self.npos_max}"


RELATIVE: dict[str, type[RelativePart]] = {
    "shaw": ShawRelative,
    "transformer_xl": TransformerXLRelative,
    "deberta": DebertaRelative,
    "cope": CoPE,
}
