"""Remaps that choose keys from more than their positions (``Remap.reads_content``): InfLLM's block retrieval
and DuoAttention's per-head split. Both keep every key in the KV cache (their mask is causal), and both are
defined per query, so a full forward equals cached decoding.

Why InfLLM rather than ReAttention (arXiv 2407.15176): InfLLM gives every key outside the local window one
fixed distance (its ``apply_rotary_pos_emb_one_angle(q, n_local)`` with un-rotated keys), which is exactly
ReRoPE's far branch, so the retrieval is a mask on the two branches posenc already runs, and the keys are
rotated once per call. ReAttention re-numbers the selected keys per query (their positions depend on which
keys were chosen), so each query needs its own rotation of its own keys, and no shared rotation of the cache
exists; its selection (top-k tokens by position-free q.k) is the special case ``block=1`` of the one here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc._util import check_positive_int
from posenc.parts.branches import Branch, Remap, far_band, near_band


@dataclass(frozen=True)
class BlockRetrieval(Remap):
    """InfLLM-style block retrieval (Xiao et al. 2024, "InfLLM: Training-Free Long-Context Extrapolation for
    LLMs with an Efficient Context Memory", arXiv 2402.04617; thunlp/InfLLM ``context_manager.py``).

    With ``window`` w (InfLLM's ``n_local``), ``n_sinks`` (``n_init``), ``block`` b (``block_size``) and
    ``top_k`` (``topk``), a query at qp sees

    - the local window, d = qp - kp < w, at its true distance;
    - every other key at the one distance w (ReRoPE's far branch: query at w, key at 0), if it is
      an initial token (kp < n_sinks), or in the *remainder* (its block still reaches into the window), or
      in one of the ``top_k`` blocks chosen among the *complete* blocks: block j holds keys
      ``n_sinks + j b .. n_sinks + (j + 1) b - 1`` and is complete for qp when its last key is outside the
      window (``n_sinks + (j + 1) b - 1 <= qp - w``).

    Blocks are ranked by ``r_j = sum_h q_h . kbar_(h,j)``, the un-rotated query against the block's
    representative ``kbar`` = the mean of its un-rotated keys (padding excluded); with ``per_head`` each
    head ranks on its own (InfLLM's ``perhead``). When at most ``top_k`` blocks are complete, all are seen.
    Scores are computed in float64, so the full forward and a decode step rank alike.

    Where this departs from InfLLM, on purpose: (1) InfLLM picks each block's representative as the mean of
    its ``repr_topk`` keys with the highest attention received while in the local window, a quantity of the
    order the chunks were processed in; here it is the mean of all the block's keys (InfLLM with
    ``repr_topk = block_size``), a function of the keys alone. (2) InfLLM ranks blocks once per chunk of
    ``exc_block_size`` queries by the chunk's mean query; here every query ranks for itself (InfLLM's
    decoding, chunk = 1), so the full forward equals cached decoding. (3) InfLLM keeps blocks in a GPU/CPU
    offload cache (``max_cached_block``); that changes no output and is not modelled. InfLLM runs only on
    CUDA (``torch.cuda`` streams), so the tests check this against a dense re-implementation of the rule
    above and hand-computed cases."""

    window: int = 512
    n_sinks: int = 4
    block: int = 64
    top_k: int = 4
    per_head: bool = False
    name = "retrieval"
    remaps_distance = True
    reads_content = True
    selects_far_only = True  # the local window (d < window) is always kept

    def __post_init__(self):
        check_positive_int("retrieval.window", self.window)
        check_positive_int("retrieval.n_sinks", self.n_sinks, minimum=0)
        check_positive_int("retrieval.block", self.block)
        check_positive_int("retrieval.top_k", self.top_k, minimum=0)
        if not isinstance(self.per_head, bool):
            raise ValueError(f"retrieval.per_head must be true or false, got {self.per_head!r}")

    def branches(self) -> list[Branch]:
        """ReRoPE's two branches at ``window``: the near one at true distance, the far one with the query at
        position w and the key unrotated (InfLLM's one angle)."""
        w = self.window
        return [Branch(region=near_band(w), kind="near", window=w),
                Branch(region=far_band(w), q_rot=lambda qp: torch.full_like(qp, w), k_rot=torch.zeros_like,
                       kind="far", window=w)]

    def relative(self, qp, kp):
        d = (qp - kp).double()
        return torch.where(d < self.window, d, torch.full_like(d, self.window))

    def key_summary(self, k: torch.Tensor, kp: torch.Tensor, key_mask):
        return self.representatives(k, kp, key_mask)

    def representatives(self, k: torch.Tensor, kp: torch.Tensor, key_mask):
        """``(kbar [B,Hk,nb,D] float64, has_keys [B,nb])``: the mean un-rotated key of each block (per key head),
        and whether the block holds a real key."""
        B, H, _, D = k.shape
        blk = torch.div(kp - self.n_sinks, self.block, rounding_mode="floor")  # [B,Nk]; < 0 for the sinks
        ok = blk >= 0 if key_mask is None else (blk >= 0) & key_mask
        nb = max(int(blk.max()) + 1, 1)
        idx = torch.where(ok, blk, torch.full_like(blk, nb))  # non-block keys into a dropped slot nb
        sums = k.new_zeros(B, H, nb + 1, D, dtype=torch.float64).scatter_add_(
            2, idx[:, None, :, None].expand(B, H, -1, D), k.double())
        counts = torch.zeros(B, nb + 1, dtype=torch.float64, device=k.device).scatter_add_(1, idx, ok.double())
        counts = counts[:, :nb]
        return sums[:, :, :nb] / counts.clamp(min=1.0)[:, None, :, None], counts > 0

    def select(self, h, q, qp, k, kp, key_mask, summary=None):
        """Visible keys ``[B,H or 1,nq,Nk]`` (see the class docstring); the causal mask is the scheme's.
        ``summary``: :meth:`representatives` of these keys, when the caller computed them once per call."""
        seen, kb = self._blocks(q, qp, k, kp, key_mask, summary)
        return seen.gather(-1, kb[:, None, None, :].expand(*seen.shape[:3], -1))

    def select_keys(self, h, q, qp, k, kp, key_mask, summary=None):
        """:meth:`select` as ``(idx, chosen)``: only the keys of the blocks some query chose, then each query's
        choice over them, built from the per-block choice (no ``[nq, Nk]`` pass over every key)."""
        seen, kb = self._blocks(q, qp, k, kp, key_mask, summary)
        cand = seen.any(dim=1).any(dim=1).gather(1, kb).any(dim=0)  # [Nk]: the key's block is seen by some query
        if bool(cand.all()):
            return None, seen.gather(-1, kb[:, None, None, :].expand(*seen.shape[:3], -1))
        idx = cand.nonzero().flatten()
        kb = kb.index_select(1, idx)
        return idx, seen.gather(-1, kb[:, None, None, :].expand(*seen.shape[:3], -1))

    def _blocks(self, q, qp, k, kp, key_mask, summary):
        """``(seen [B,H or 1,nq,nb+1], kb [B,Nk])``: whether each query sees block j (j >= its first incomplete
        block: the remainder, the local window and later keys; or j among its top-k complete blocks), with a
        last column nb for the sinks (always seen); and each key's column (its block, or nb for a sink). Every
        key at distance < window lies in an incomplete block or is a sink, so this is the whole choice."""
        w, s, b = self.window, self.n_sinks, self.block
        kbar, has_keys = self.representatives(k, kp, key_mask) if summary is None else summary
        nb = kbar.shape[2]
        if kbar.shape[1] != q.shape[1]:  # grouped keys: query head h reads key head h // (H / Hk)
            kbar = kbar.repeat_interleave(q.shape[1] // kbar.shape[1], dim=1)
        j = torch.arange(nb, device=q.device)
        complete = torch.div(qp - w - s + 1, b, rounding_mode="floor")[:, None, :, None]  # [B,1,nq,1]: 0..complete-1
        seen = j[None, None, None, :] >= complete  # [B,1,nq,nb]
        if self.top_k > 0 and bool((complete > 0).any()):
            score = q.double() @ kbar.transpose(-1, -2)  # [B,H,nq,nb]
            if not self.per_head:
                score = score.sum(dim=1, keepdim=True)  # [B,1,nq,nb]
            eligible = ~seen & has_keys[:, None, None, :]
            score = score.masked_fill(~eligible, float("-inf"))
            top = score.topk(min(self.top_k, nb), dim=-1)
            chosen = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, top.indices, top.values > float("-inf"))
            seen = seen | chosen
        seen = torch.cat([seen, seen.new_ones(*seen.shape[:3], 1)], dim=-1)
        blk = torch.div(kp - s, b, rounding_mode="floor")  # [B,Nk]; < 0 for the sinks
        return seen, torch.where(blk < 0, torch.full_like(blk, nb), blk)


@dataclass(frozen=True)
class DuoAttention(Remap):
    """DuoAttention's split (Xiao et al. 2024, "DuoAttention: Efficient Long-Context LLM Inference with Retrieval
    and Streaming Heads", arXiv 2410.10819; mit-han-lab/duo-attention ``duo_attn/patch``): the query heads in
    ``streaming`` see only the ``n_sinks`` first keys and the ``window`` most recent ones (d < window, the
    current token counted, as the original's ``generate_streaming_mask`` with ``recent_size = window``); every
    other head (a retrieval head) attends to every key. Positions are not changed: keys keep their original
    rotation, as in the original, which rotates keys before caching them.

    The heads are *query* heads; DuoAttention decides per key/value head, which is the query heads of that
    group (:func:`posenc.parts.retrieval.duo_query_heads`). The choice comes from a calibration
    (:func:`posenc.evals.calibrate.calibrate_duo`, training-free here: the original optimises gates on
    synthetic passkey data, ``duo_attn/train.py``). The original keeps a smaller cache for the streaming heads;
    posenc's cache is per layer, so it keeps every key and the split saves compute, not memory."""

    calibrated = True

    streaming: tuple = ()
    n_sinks: int = 4
    window: int = 256
    name = "duo"
    reads_content = True

    def __post_init__(self):
        heads = self.streaming
        if not isinstance(heads, (list, tuple)) or any(isinstance(x, bool) or not isinstance(x, int) or x < 0
                                                       for x in heads) or len(set(heads)) != len(heads):
            raise ValueError(f"duo.streaming must be a list of distinct query-head indices >= 0, got {heads!r}")
        object.__setattr__(self, "streaming", tuple(sorted(heads)))
        check_positive_int("duo.n_sinks", self.n_sinks, minimum=0)
        check_positive_int("duo.window", self.window)

    def select(self, h, q, qp, k, kp, key_mask, summary=None):  # noqa: ARG002 - chooses by head only
        H = q.shape[1]
        if self.streaming and max(self.streaming) >= H:
            raise ValueError(f"duo.streaming must name query heads in [0, {H}), got {list(self.streaming)}")
        streaming = torch.zeros(H, dtype=torch.bool, device=q.device)
        streaming[list(self.streaming)] = True
        qg, kg = qp[:, None, :, None], kp[:, None, None, :]
        local = ((qg - kg) < self.window) | (kg < self.n_sinks)  # [B,1,nq,Nk]
        return local | ~streaming[None, :, None, None]  # [B,H,nq,Nk]

    def to_dict(self) -> dict:
        return {"kind": self.name, "streaming": list(self.streaming), "n_sinks": self.n_sinks, "window": self.window}


def duo_query_heads(kv_heads, n_heads: int, n_kv_heads: int) -> list[int]:
    """The query heads of key/value heads ``kv_heads`` (GQA: query head h reads KV head h // (H / Hk))."""
    check_positive_int("n_heads", n_heads)
    check_positive_int("n_kv_heads", n_kv_heads)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    g = n_heads // n_kv_heads
    bad = [x for x in kv_heads if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n_kv_heads]
    if bad:
        raise ValueError(f"kv_heads must be in [0, {n_kv_heads}), got {bad}")
    return [kv * g + i for kv in sorted(kv_heads) for i in range(g)]
