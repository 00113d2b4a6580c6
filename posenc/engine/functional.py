"""The functional API: :func:`attention` for parameter-free schemes."""

from __future__ import annotations

import torch

from posenc.engine.dispatch import check_inputs, run_attention
from posenc.engine.parts import parts_for
from posenc.scheme.core import PositionScheme


def attention(q, k, v, scheme: PositionScheme, q_pos=None, k_pos=None, impl: str = "auto",
              scale: float | None = None, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Functional attention for parameter-free schemes (RoPE and its extensions, ALiBi, masks,
    remaps): ``q [B,H,Nq,D]``, ``k, v [B,Hk,Nk,D]`` un-rotated; positions default to the last Nq of
    0..Nk-1. Returns ``[B,H,Nq,D]``. Schemes with learned parts need
    :class:`~posenc.engine.module.PositionalAttention`. ``impl``: ``"auto"`` or a backend name (see
    :mod:`posenc.engine.dispatch`)."""
    if not isinstance(scheme, PositionScheme):
        raise ValueError(f"scheme must be a PositionScheme, got {type(scheme).__name__}")
    check_inputs(q, k, v, impl, scale, key_mask)
    parts = parts_for(scheme.to_json(), q.shape[1], q.shape[-1], str(q.device))
    return run_attention(parts, q, k, v, q_pos, k_pos, impl=impl, scale=scale, key_mask=key_mask)
