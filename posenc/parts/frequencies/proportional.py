"""Proportional RoPE (p-RoPE, Gemma 4): ``proportional``, the highest-frequency fraction of the pairs rotated,
the rest left unrotated."""

from __future__ import annotations

import torch

from posenc.parts.frequencies.registry import RopeFrequencies, register
from posenc.parts.frequencies.shared import exponents


def _proportional_factor(params, seq_len):
    """``factor``, 1.0 when absent."""
    return params.get("factor", 1.0)


@register("proportional", ("factor",), factor=_proportional_factor)
def _proportional(head_dim, dim, base, params, seq_len):
    """Proportional RoPE (Gemma 4), i.e. p-RoPE (Barbero et al., "Round and Round We Go! What makes Rotary
    Positional Encodings useful?", arXiv 2410.06205) with ``p = partial_rotary_factor``:
    ``theta_i = base ** (-2i/head_dim) / factor`` if i < rotary_dim/2, else 0. The fraction p of the pairs
    with the highest frequencies keeps full RoPE's ladder; the rest (the lowest frequencies) are not
    rotated at all (NoPE pairs). Method record ``p_rope`` in :mod:`posenc.scheme.methods`.

    Matches HF ``_compute_proportional_rope_parameters``: the exponent uses the *full* head_dim and
    the result has ``head_dim // 2`` entries (zero frequency = that pair is not rotated), so the
    rotation is applied to the whole head with the half layout, not as partial RoPE on the first
    ``rotary_dim`` dims. This is the one schedule whose ``inv_freq`` is longer than ``rotary_dim // 2``.
    Refuses an odd ``head_dim``.
    """
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rope_type 'proportional', got {head_dim}")
    rotated = exponents(dim, head_dim)  # [dim/2]: 2i / head_dim
    inv_freq = torch.zeros(head_dim // 2, dtype=torch.float64)
    inv_freq[: dim // 2] = 1.0 / base ** rotated
    return RopeFrequencies(inv_freq / params.get("factor", 1.0), 1.0)
