"""What several schedules read: RoPE's default ladder ``base ** (-2i/d)`` in float64, and ``factor`` and the
trained length ``L`` out of a validated ``params`` dict (refusing a missing one with the key and its range)."""

from __future__ import annotations

import torch

from posenc.parts.frequencies.registry import LENGTH_KEYS, RopeFrequencies

__all__ = ["default_inv_freq", "exponents", "inferred_factor", "plain", "stated_factor", "trained_len"]


def exponents(dim: int, denominator: int | None = None) -> torch.Tensor:
    """``2i / denominator`` for i = 0 .. dim/2 - 1, float64 ``[dim // 2]``."""
    return torch.arange(0, dim, 2, dtype=torch.float64) / (denominator or dim)


def default_inv_freq(dim: int, base: float) -> torch.Tensor:
    """``base ** (-2i / dim)``, float64 ``[dim // 2]``."""
    return 1.0 / (base ** exponents(dim))


def plain(dim: int, base: float) -> RopeFrequencies:
    """The default ladder with attention scale 1."""
    return RopeFrequencies(default_inv_freq(dim, base), 1.0)


def stated_factor(params: dict, rope_type: str) -> float:
    """``params['factor']``; refused when missing."""
    if "factor" not in params:
        raise ValueError(f"scaling['factor'] is required for rope_type {rope_type!r} (a finite number >= 1)")
    return params["factor"]


def inferred_factor(params: dict) -> float | None:
    """``factor``, else ``max_position_embeddings / original_max_position_embeddings`` when both are given
    (HF's rule for YaRN and LongRoPE), else None."""
    if "factor" in params:
        return params["factor"]
    if all(k in params for k in LENGTH_KEYS):
        return params["max_position_embeddings"] / params["original_max_position_embeddings"]
    return None


def trained_len(params: dict, rope_type: str) -> int:
    """The pretraining length L: ``original_max_position_embeddings``, else ``max_position_embeddings``."""
    for key in LENGTH_KEYS:
        if key in params:
            return params[key]
    raise ValueError(f"scaling['original_max_position_embeddings'] (an integer >= 1, the trained length) "
                     f"is required for rope_type {rope_type!r}")
