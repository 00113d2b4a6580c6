"""LongRoPE's per-pair rescale factors (Phi-3): ``longrope``."""

from __future__ import annotations

import math

import torch

from posenc.parts.frequencies.registry import RopeFrequencies, register
from posenc.parts.frequencies.shared import default_inv_freq, inferred_factor, stated_factor, trained_len


def _longrope_factor(params, seq_len):
    """``factor``, else ``max_position_embeddings / original_max_position_embeddings`` (one of them required),
    whatever ``seq_len``."""
    factor = inferred_factor(params)
    return stated_factor(params, "longrope") if factor is None else factor


@register("longrope", ("factor", "short_factor", "long_factor", "attention_factor"), dynamic=True,
          factor=_longrope_factor)
def _longrope(head_dim, dim, base, params, seq_len):
    """LongRoPE: ``theta_i = base ** (-2i/d) / lambda_i``; lambda = long_factor if seq_len > L, else short.

    arXiv 2402.13753 (Phi-3). Equals HF ``_compute_longrope_parameters``; attention scale
    ``attention_factor`` or ``sqrt(1 + ln(factor) / ln(L))`` (1 if factor <= 1), ``factor`` defaulting to
    ``max_position_embeddings / original_max_position_embeddings`` like HF. HF picks the short factors
    when ``seq_len`` is None; we require ``seq_len`` so the choice is explicit. Refuses missing lists and
    lists that are not ``rotary_dim // 2`` long.
    """
    trained = trained_len(params, "longrope")
    key = "long_factor" if seq_len > trained else "short_factor"
    for name in ("short_factor", "long_factor"):
        if name not in params:
            raise ValueError(f"scaling[{name!r}] is required for rope_type 'longrope' "
                             f"({dim // 2} numbers > 0)")
        if len(params[name]) != dim // 2:
            raise ValueError(f"scaling[{name!r}] must have rotary_dim // 2 = {dim // 2} entries, "
                             f"got {len(params[name])}")
    attention = params.get("attention_factor")
    if attention is None:
        factor = inferred_factor(params)
        if factor is None:
            raise ValueError("rope_type 'longrope' needs scaling['factor'] (>= 1), "
                             "scaling['attention_factor'], or both max_position_embeddings and "
                             "original_max_position_embeddings")
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(trained))
    ext = torch.tensor(params[key], dtype=torch.float64)
    return RopeFrequencies(default_inv_freq(dim, base) / ext, float(attention))
