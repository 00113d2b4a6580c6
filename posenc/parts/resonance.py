"""Resonance RoPE's rounding of RoPE wavelengths, applied by :func:`posenc.parts.frequencies.rope_frequencies`
after any schedule (``scaling["resonance"] = True``)."""

from __future__ import annotations

import math

import torch

__all__ = ["resonance"]


def resonance(inv_freq: torch.Tensor, on: bool = True) -> torch.Tensor:
    """Resonance RoPE (Wang et al. 2024, arXiv 2403.00071; sheryc/resonance_rope ``resonance_register``):
    ``theta_i' = 2 pi / round(2 pi / theta_i)``, every wavelength rounded to an integer number of positions, so
    a dimension whose wavelength is shorter than the trained length repeats exactly the angles it was trained
    on at every later position. Applied after the schedule (``scaling["resonance"] = True`` on any
    ``rope_type``; the original's Resonance-YaRN rounds YaRN's frequencies the same way). All dimensions are
    rounded, as in the original's code (the paper names the pre-critical ones; for a wavelength longer than
    the trained length the rounding moves theta by less than 1 / (2 wavelength) relative). Frequencies of 0
    (p-RoPE's unrotated pairs) stay 0; a wavelength below 0.5 would round to 0 and is kept at 1. ``on=False``
    returns ``inv_freq`` unchanged.
    The original computes angles as ``(t mod lambda) * theta'`` in float32; posenc as ``t * theta'`` in float64,
    the same angle modulo 2 pi."""
    if on not in (False, True):
        raise ValueError(f"scaling['resonance'] must be true or false, got {on!r}")
    if not on:
        return inv_freq
    inv = inv_freq.double()
    wave = torch.round(2 * math.pi / inv.clamp(min=1e-300)).clamp(min=1.0)
    return torch.where(inv > 0, 2 * math.pi / wave, inv)
