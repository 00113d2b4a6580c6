"""The branch record and the remap base class shared by :mod:`posenc.parts.remap` and
:mod:`posenc.parts.retrieval` (see :mod:`posenc.parts.remap` for what a remap is)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

__all__ = ["Branch", "Elementwise", "Remap", "far_band", "near_band"]

Elementwise = Callable[..., torch.Tensor]


def _identity(p: torch.Tensor) -> torch.Tensor:
    return p


@dataclass(frozen=True)
class Branch:
    """One rotation of queries and keys, valid on ``region`` (None = every pair).

    ``q_rot(qp)`` / ``k_rot(kp)`` give the positions at which q and k are rotated (integers);
    ``freq_scale`` multiplies inv_freq for this branch. ``kind`` is "near" (|d| below a window),
    "far", "all", or for chunked regions (``window`` = chunk length c) "same_chunk" (``kp // c ==
    qp // c``), "previous_chunk" (one chunk back) and "earlier_chunks" (two or more back); the engine
    uses it only to know which keys a branch can touch.
    """

    region: Elementwise | None = None
    q_rot: Elementwise = _identity
    k_rot: Elementwise = _identity
    freq_scale: float = 1.0
    kind: str = "all"
    window: int | None = None  # for kind near/far: the d threshold


class Remap:
    """Base class: identity (plain RoPE). Subclasses are frozen dataclasses."""

    name = "none"
    #: True when :meth:`allowed` imposes a mask of its own (set on every subclass that overrides it), so
    #: the engine knows without calling it whether the scheme's mask is the whole mask.
    restricts_keys: bool = False
    #: True when :meth:`relative` differs from ``qp - kp`` (set on every subclass that overrides it): a
    #: bias must then see the remapped distance, and a kernel that reads the bias by true distance
    #: cannot run the scheme.
    remaps_distance: bool = False
    #: True when :meth:`select` restricts keys by head or by content (set on every subclass that overrides it):
    #: only backends that finish on a materialised score tile can run it.
    reads_content: bool = False
    #: True when :meth:`select` never hides a key nearer than the near branch's window (InfLLM keeps its local
    #: window whole): the ``retrieved`` backend then runs the near band on the fused kernel, selecting far keys only.
    selects_far_only: bool = False
    #: multiplies every logit (STRING's attention factor squared); 1 for the others
    logit_scale: float = 1.0
    #: True when the remap's choice of heads comes from a calibration on the model (DuoAttention's streaming heads,
    #: :func:`posenc.evals.calibrate.calibrate_duo`), which then reads every head of such a layer as retrieving
    calibrated: bool = False

    def branches(self) -> list[Branch]:
        return [Branch()]

    def key_summary(self, k: torch.Tensor, kp: torch.Tensor, key_mask: torch.Tensor | None):
        """What :meth:`select` reads of the keys, computed once per attention call and passed to every
        query tile's ``select`` as ``summary`` (InfLLM's block representatives); None: nothing."""
        return None

    def select(self, h: torch.Tensor, q: torch.Tensor, qp: torch.Tensor, k: torch.Tensor, kp: torch.Tensor,
               key_mask: torch.Tensor | None, summary=None) -> torch.Tensor | None:
        """Keys each (head, query) may see beyond the position mask: bool broadcastable to ``[B,H,nq,Nk]``, from
        the head index ``h [1,H,1,1]``, un-rotated queries ``q [B,H,nq,D]`` at ``qp [B,nq]`` and *every* key of
        the call ``k [B,H,Nk,D]`` at ``kp [B,Nk]`` (``key_mask [B,Nk]``: padding), with ``summary`` =
        :meth:`key_summary` of those keys when the caller has it (else it is computed here); None: no
        restriction."""
        return None

    def select_keys(self, h: torch.Tensor, q: torch.Tensor, qp: torch.Tensor, k: torch.Tensor, kp: torch.Tensor,
                    key_mask: torch.Tensor | None, summary=None):
        """:meth:`select` in sparse form: ``(idx, chosen)`` with ``idx [K]`` the keys some (row, head, query)
        may see (None: every key) and ``chosen [B,H|1,nq,K]`` the choice over them, so that a caller pays for the
        chosen keys only. Here: from :meth:`select` (a remap that chooses blocks overrides it)."""
        chosen = self.select(h, q, qp, k, kp, key_mask, summary)
        if chosen is None:
            return None, None
        chosen = chosen.expand(chosen.shape[0], chosen.shape[1], q.shape[2], k.shape[2])
        cols = chosen.any(dim=0).any(dim=0).any(dim=0)  # [Nk]
        if bool(cols.all()):
            return None, chosen
        idx = cols.nonzero().flatten()
        return idx, chosen.index_select(-1, idx)

    def relative(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        """Relative position RoPE sees for each pair (float), for docs, tests and plots."""
        return (qp - kp).double()

    def allowed(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor | None:
        """An extra mask this remap imposes (None: none). Conjoined with the scheme's mask."""
        return None

    def exact_within(self) -> tuple[float, float] | None:
        """``(D, P)``: on causal pairs with distance ``qp - kp < D`` and query position ``qp < P`` this remap is
        plain RoPE (the same rotation, no restriction, logit scale 1), so a call whose pairs all stay there may
        run without it (:mod:`posenc.engine.exact`). None (the default, for every remap that does not state
        it): never assumed."""
        return None

    def to_dict(self) -> dict:
        return {"kind": self.name, **asdict(self)} if hasattr(self, "__dataclass_fields__") else {
            "kind": self.name}


def near_band(w: int) -> Elementwise:
    """Region ``d = qp - kp < w``."""
    return lambda qp, kp: (qp - kp) < w


def far_band(w: int) -> Elementwise:
    """Region ``d = qp - kp >= w``."""
    return lambda qp, kp: (qp - kp) >= w
