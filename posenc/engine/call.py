"""One attention call as every backend sees it: :class:`AttentionCall`."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from posenc.engine.parts import AttentionParts


@dataclass(frozen=True, eq=False)
class AttentionCall:
    """What every backend reads: the layer's parts, the un-rotated projections (keys and values already
    repeated to the query heads), the positions, the padding, whether autograd needs this call and, for a
    forget-gate scheme (FoX), the cumulative log gates of queries and keys, and learned attention sinks
    (``sink_logits``: one logit per head, a virtual key of value 0 that every query sees; GPT-OSS's ``s_aux``).

    ``freqs`` (the RoPE frequencies of the call's schedule, None without RoPE) and ``q_scale`` (the
    ``[B,1,Nq,1]`` multiplier folded into q: softmax scale x YaRN factor^2 x log-n) are filled in per
    dynamic-schedule group by :func:`posenc.engine.dispatch.run_attention`; ``why_not`` checks must not
    read them (the choice is made once for the whole call, before the grouping).
    """

    parts: AttentionParts
    q: torch.Tensor  # [B,H,Nq,D] un-rotated queries
    k: torch.Tensor  # [B,H,Nk,D] un-rotated keys, GQA-expanded
    v: torch.Tensor  # [B,H,Nk,Dv] values, GQA-expanded
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

    @property
    def B(self) -> int:
        return self.q.shape[0]

    @property
    def H(self) -> int:
        return self.q.shape[1]

    @property
    def Nq(self) -> int:
        return self.q.shape[2]

    @property
    def Nk(self) -> int:
        return self.k.shape[2]

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
