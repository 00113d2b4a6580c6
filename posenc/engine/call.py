"""One attention call as every backend sees it: :class:`AttentionCall`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch

from posenc.engine.parts import AttentionParts, expand_kv

_FACTS: dict = {}  # position facts already computed: key of the tensors -> (value, the tensors, kept alive)
_MAX_FACTS = 32


def memo_positions(kind: str, tensors: tuple, compute):
    """``compute()``, remembered for these position tensors while they are unchanged: the key is each tensor's
    identity, version counter (bumped by every in-place write), data pointer, shape and strides, and the entry
    holds the tensors so no identity is reused while it lives. The layers of one forward share their position
    tensors, so a fact about them (keys at their indices, queries a contiguous run) is computed once per
    forward, not once per layer. Inference-mode tensors keep no version counter: computed every time."""
    try:
        key = (kind,) + tuple((id(t), t._version, t.data_ptr(), tuple(t.shape), t.stride()) for t in tensors)
    except RuntimeError:
        return compute()
    hit = _FACTS.get(key)
    if hit is not None:
        return hit[0]
    value = compute()
    if len(_FACTS) >= _MAX_FACTS:
        _FACTS.pop(next(iter(_FACTS)))
    _FACTS[key] = (value, tensors)
    return value


def _position_run(q_pos: torch.Tensor, k_pos: torch.Tensor) -> int | None:
    Nq, Nk = q_pos.shape[1], k_pos.shape[1]
    if not bool((k_pos == k_pos[:1]).all() and (q_pos == q_pos[:1]).all()):
        return None
    q0 = int(q_pos[0, 0])
    ok = bool((k_pos[0] == torch.arange(Nk, device=k_pos.device)).all()) and q0 + Nq <= Nk and bool(
        (q_pos[0] == torch.arange(q0, q0 + Nq, device=q_pos.device)).all())
    return q0 if ok else None


def position_run(q_pos: torch.Tensor, k_pos: torch.Tensor) -> int | None:
    """The first query position when keys sit at ``0..Nk-1`` and queries at a contiguous run
    ``q0..q0+Nq-1`` with ``q0 + Nq <= Nk``, identically in every row (a full forward, a prefill, or a
    decode step without padding); None otherwise. The fused CPU paths index keys by position.
    Remembered per position tensors (:func:`memo_positions`)."""
    return memo_positions("run", (q_pos, k_pos), lambda: _position_run(q_pos, k_pos))


def keys_at_indices(k_pos: torch.Tensor) -> bool:
    """Every row of ``k_pos [B,Nk]`` is ``0..Nk-1`` (remembered like :func:`position_run`)."""
    def compute() -> bool:
        return bool((k_pos == torch.arange(k_pos.shape[1], device=k_pos.device)).all())
    return memo_positions("indices", (k_pos,), compute)


@dataclass(frozen=True, eq=False)
class AttentionCall:
    """What every backend reads: the layer's parts, the un-rotated projections (keys and values with their own
    ``Hk`` heads: GQA is not expanded here, see :meth:`expanded`), the positions, the padding, whether autograd
    needs this call and, for a
    forget-gate scheme (FoX), the cumulative log gates of queries and keys, and learned attention sinks
    (``sink_logits``: one logit per head, a virtual key of value 0 that every query sees; GPT-OSS's ``s_aux``), and
    the layer's :class:`~posenc.engine.keystore.KeyStore` when its owner keeps rotated keys across calls.

    ``freqs`` (the RoPE frequencies of the call's schedule, None without RoPE) and ``q_scale`` (the
    ``[B,1,Nq,1]`` multiplier folded into q: softmax scale x YaRN factor^2 x log-n) are filled in per
    dynamic-schedule group by :func:`posenc.engine.dispatch.run_attention`; ``why_not`` checks must not
    read them (the choice is made once for the whole call, before the grouping).
    """

    parts: AttentionParts
    q: torch.Tensor  # [B,H,Nq,D] un-rotated queries
    k: torch.Tensor  # [B,Hk,Nk,D] un-rotated keys; Hk divides H (GQA: query head h reads key head h // (H/Hk))
    v: torch.Tensor  # [B,Hk,Nk,Dv] values
    q_pos: torch.Tensor  # [B,Nq] long, original token positions
    k_pos: torch.Tensor  # [B,Nk] long
    key_mask: torch.Tensor | None  # [B,Nk] bool, True = real token; None = no padding
    needs_grad: bool  # autograd is on and q, k or v requires a gradient
    freqs: object | None = None  # RopeFrequencies of this (group's) schedule
    q_scale: torch.Tensor | None = None  # [B,1,Nq,1]
    q_axes: torch.Tensor | None = None  # [B or 1,Nq,A] long: multi-axis RoPE coordinates (None: 1-D RoPE)
    k_axes: torch.Tensor | None = None  # [B or 1,Nk,A]
    q_gate: torch.Tensor | None = None  # [B,H,Nq] cumulative log forget gates of the queries (FoX), or None
    k_gate: torch.Tensor | None = None  # [B,H,Nk] the same of the keys (posenc.parts.gates.forget_bias)
    sink_logits: torch.Tensor | None = None  # [H] learned sink logits in every softmax denominator (GPT-OSS), or None
    key_store: object | None = None  # a KeyStore: the layer's keys rotated by earlier calls (engine.keystore), or None

    @property
    def B(self) -> int:
        return self.q.shape[0]

    @property
    def H(self) -> int:
        return self.q.shape[1]

    @property
    def Hk(self) -> int:
        return self.k.shape[1]

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head (1 without GQA)."""
        return self.q.shape[1] // self.k.shape[1]

    @property
    def Nq(self) -> int:
        return self.q.shape[2]

    @property
    def Nk(self) -> int:
        return self.k.shape[2]

    @cached_property
    def q_run(self) -> int | None:
        """:func:`position_run` of the call's positions (the first query position, or None)."""
        return position_run(self.q_pos, self.k_pos)

    @cached_property
    def keys_are_indices(self) -> bool:
        """Key positions are ``0..Nk-1`` in every row (keys then rotate from a table's rows as a view)."""
        return keys_at_indices(self.k_pos)

    @cached_property
    def key_summary(self):
        """The remap's :meth:`~posenc.parts.branches.Remap.key_summary` of this call's keys, computed once
        however many query tiles select against them."""
        return self.parts.remap.key_summary(self.k, self.k_pos, self.key_mask)

    def expanded(self) -> AttentionCall:
        """This call with keys and values repeated to the query heads (``[B,H,Nk,D]``), for the paths that read
        keys per query head (:meth:`posenc.engine.backends.base.Backend.gqa`); itself without GQA."""
        if self.n_rep == 1:
            return self
        return replace(self, k=expand_kv(self.k, self.H), v=expand_kv(self.v, self.H), key_store=None)

    def scheduled(self, freqs, q_scale: torch.Tensor) -> AttentionCall:
        """This call with its schedule's frequencies and query scale filled in."""
        return replace(self, freqs=freqs, q_scale=q_scale)

    def select_queries(self, idx: torch.Tensor) -> AttentionCall:
        """The queries at indices ``idx`` (the same in every row) against every key."""
        return replace(self, q=self.q.index_select(2, idx), q_pos=self.q_pos.index_select(1, idx),
                       q_scale=self.q_scale.index_select(2, idx),
                       q_axes=None if self.q_axes is None else self.q_axes.index_select(1, idx),
                       q_gate=None if self.q_gate is None else self.q_gate.index_select(2, idx))

    def key_prefix(self, n: int) -> AttentionCall:
        """The first ``n`` keys only (attention sinks)."""
        return replace(self, k=self.k[:, :, :n], v=self.v[:, :, :n], k_pos=self.k_pos[:, :n],
                       k_axes=None if self.k_axes is None else self.k_axes[:, :n],
                       key_mask=None if self.key_mask is None else self.key_mask[:, :n],
                       k_gate=None if self.k_gate is None else self.k_gate[:, :, :n])

    def gate_bias(self, qp, kp, q_sel=slice(None), k_idx=None) -> torch.Tensor | None:
        """The forget-gate bias ``[B,H,nq,nk]`` of queries ``q_sel`` against keys ``k_idx`` (None: all) at the
        position grids ``qp [B,1,nq,1]``, ``kp [B,1,1,nk]``; None without a gate."""
        if self.q_gate is None:
            return None
        from posenc.parts.gates import forget_bias

        kg = self.k_gate if k_idx is None else self.k_gate.index_select(2, k_idx)
        return forget_bias(self.q_gate[:, :, q_sel, None], kg[:, :, None, :], qp, kp)
