"""Llama 3.1's frequency-band interpolation: ``llama3``."""

from __future__ import annotations

import math

import torch

from posenc.parts.frequencies.registry import RopeFrequencies, register
from posenc.parts.frequencies.shared import default_inv_freq, stated_factor, trained_len


def _llama3_factor(params, seq_len):
    """``factor`` (required)."""
    return stated_factor(params, "llama3")


@register("llama3", ("factor", "low_freq_factor", "high_freq_factor"), factor=_llama3_factor)
def _llama3(head_dim, dim, base, params, seq_len):
    """Llama 3.1: ``theta/factor`` if wavelength > L/low, ``theta`` if < L/high, linear in L/wavelen between.

    Meta Llama 3 herd paper, arXiv 2407.21783 (code: meta-llama ``apply_scaling``). Equals HF
    ``_compute_llama3_parameters``; we refuse ``high_freq_factor <= low_freq_factor`` (HF warns, then
    divides by zero).
    """
    factor, L = stated_factor(params, "llama3"), trained_len(params, "llama3")
    for key in ("low_freq_factor", "high_freq_factor"):
        if key not in params:
            raise ValueError(f"scaling[{key!r}] is required for rope_type 'llama3' (a finite number > 0)")
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    if high <= low:
        raise ValueError(f"scaling['high_freq_factor'] must be > low_freq_factor ({low}), got {high}")
    inv_freq = default_inv_freq(dim, base)
    wavelen = 2 * math.pi / inv_freq
    smooth = (L / wavelen - low) / (high - low)  # 0 at wavelen = L/low, 1 at wavelen = L/high
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen < L / high, inv_freq, blended)  # high frequencies untouched
    out = torch.where(wavelen > L / low, inv_freq / factor, out)  # low frequencies interpolated
    return RopeFrequencies(out, 1.0)
