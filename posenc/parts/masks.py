"""Mask part: which keys a query may see.

Every mask is a frozen dataclass whose ``allowed(qp, kp)`` is an *elementwise* function of query
and key positions (LongTensors that broadcast). The same function serves the reference path (called
on grids ``qp [B,1,Nq,1]``, ``kp [B,1,1,Nk]``) and FlexAttention's ``mask_mod`` (called on 0-d
tensors). ``never_visible_again(kp, qp_latest)`` tells the KV cache which keys no future query
(position > qp_latest) can see, so windowed schemes keep memory bounded by the window.

Masks compose by conjunction (:class:`MaskSpec` holds the parts a scheme switches on).

Papers:
- causal: Vaswani et al. 2017 (arXiv 1706.03762).
- sliding window: Beltagy et al., Longformer (arXiv 2004.05150); alone it does not extrapolate.
- Lambda-shape (n_global first tokens + local window): LM-Infinite, Han et al. (arXiv 2308.16137).
- attention sinks + recent window: StreamingLLM, Xiao et al. (arXiv 2309.17453).
- blockwise causal attention (BCA): xPos / LEX, Sun et al. (arXiv 2212.10554), block = L_train / 2:
  a query sees its own block and the previous one.
- chunked attention: Llama 4's local layers (Meta, "The Llama 4 herd", ai.meta.com/blog/llama-4-multimodal-intelligence;
  transformers' ``Llama4TextConfig.attention_chunk_size``): a query sees only the keys of its own chunk,
  kp // chunk == qp // chunk (BCA also sees the previous block).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from posenc._util import check_positive_int


@dataclass(frozen=True)
class MaskSpec:
    """Conjunction of mask parts. ``None``/0 switches a part off.

    - ``causal``: kp <= qp.
    - ``window``: a key is visible if qp - kp < window (the current token counts as 1) ...
    - ``n_sinks``: ... or if kp < n_sinks (the first tokens: LM-Infinite's global branch,
      StreamingLLM's attention sinks). Without ``window`` the sinks change nothing.
    - ``block``: BCA: visible if kp // block >= qp // block - 1.
    - ``chunk``: chunked attention (Llama 4): visible if kp // chunk == qp // chunk.
    """

    causal: bool = True
    window: int | None = None
    n_sinks: int = 0
    block: int | None = None
    chunk: int | None = None

    def __post_init__(self):
        if self.window is not None:
            check_positive_int("mask.window", self.window)
        if self.block is not None:
            check_positive_int("mask.block", self.block)
        if self.chunk is not None:
            check_positive_int("mask.chunk", self.chunk)
        if isinstance(self.n_sinks, bool) or not isinstance(self.n_sinks, int) or self.n_sinks < 0:
            raise ValueError(f"mask.n_sinks must be an integer >= 0, got {self.n_sinks!r}")
        if not isinstance(self.causal, bool):
            raise ValueError(f"mask.causal must be a bool, got {self.causal!r}")

    # ------------------------------------------------------------------ elementwise
    def allowed(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        ok = kp <= qp if self.causal else torch.ones_like(qp - kp, dtype=torch.bool)
        if self.window is not None:
            near = (qp - kp) < self.window
            if self.n_sinks:
                near = near | (kp < self.n_sinks)
            ok = ok & near
        if self.block is not None:
            ok = ok & (torch.div(kp, self.block, rounding_mode="floor")
                       >= torch.div(qp, self.block, rounding_mode="floor") - 1)
        if self.chunk is not None:
            ok = ok & (torch.div(kp, self.chunk, rounding_mode="floor")
                       == torch.div(qp, self.chunk, rounding_mode="floor"))
        return ok

    def never_visible_again(self, kp: torch.Tensor, qp_latest: torch.Tensor) -> torch.Tensor:
        """Keys that no query at a position > ``qp_latest`` can see (safe to evict from a cache).

        Positions only grow during generation, so a key outside the window of the next query is
        outside the window of every later one. Sinks are never evicted.
        """
        gone = torch.zeros_like(kp, dtype=torch.bool)
        nxt = qp_latest + 1
        if self.window is not None:
            far = (nxt - kp) >= self.window
            if self.n_sinks:
                far = far & (kp >= self.n_sinks)
            gone = gone | far
        if self.block is not None:
            gone = gone | (torch.div(kp, self.block, rounding_mode="floor")
                           < torch.div(nxt, self.block, rounding_mode="floor") - 1)
        if self.chunk is not None:
            gone = gone | (torch.div(kp, self.chunk, rounding_mode="floor")
                           < torch.div(nxt, self.chunk, rounding_mode="floor"))
        return gone

    def key_intervals(self, q_lo: int, q_hi: int) -> list[tuple[int, int]] | None:
        """Inclusive key-position intervals that some query with position in [q_lo, q_hi] may see
        (a superset), or None for "any key". Lets the engine skip key blocks without evaluating
        the mask against every key: a window then costs O(N * window), not O(N^2)."""
        hi = q_hi if self.causal else None
        ranges: list[tuple[int, int | None]] = [(0, hi)]
        if self.window is not None:
            near = (max(0, q_lo - self.window + 1), hi)
            ranges = [near]
            if self.n_sinks:
                ranges.append((0, min(self.n_sinks - 1, hi) if hi is not None else self.n_sinks - 1))
        if self.block is not None:
            floor = max(0, (q_lo // self.block - 1) * self.block)
            ranges = [(max(lo, floor), h) for lo, h in ranges]
        if self.chunk is not None:  # keys of the chunks from q_lo's to q_hi's
            lo_c, hi_c = q_lo // self.chunk * self.chunk, (q_hi // self.chunk + 1) * self.chunk - 1
            ranges = [(max(lo, lo_c), hi_c if h is None else min(h, hi_c)) for lo, h in ranges]
        out = [(lo, h if h is not None else 2 ** 62) for lo, h in ranges if h is None or lo <= h]
        return out

    def bounded_size(self) -> int | None:
        """Most keys any query can see, or None if unbounded (used to size caches)."""
        sizes = []
        if self.window is not None:
            sizes.append(self.window + self.n_sinks)
        if self.block is not None:
            sizes.append(2 * self.block)
        if self.chunk is not None:
            sizes.append(self.chunk)
        return min(sizes) if sizes else None

    @property
    def is_plain_causal(self) -> bool:
        return self.causal and self.window is None and self.block is None and self.chunk is None

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["chunk"] is None:  # absent when off: schemes saved before chunked attention keep their JSON
            del d["chunk"]
        return d


def materialize(mask: MaskSpec, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Boolean mask ``[B, 1, Nq, Nk]`` for positions ``q_pos [B,Nq]``, ``k_pos [B,Nk]``."""
    return mask.allowed(q_pos[:, None, :, None], k_pos[:, None, None, :])
