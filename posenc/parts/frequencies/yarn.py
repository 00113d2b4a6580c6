"""YaRN (arXiv 2309.00071): ``yarn``, ``dynamic_yarn`` and the correction range that places the ramp."""

from __future__ import annotations

import math

import torch

from posenc.parts.frequencies.registry import RopeFrequencies, register, require_seq_len
from posenc.parts.frequencies.shared import default_inv_freq, inferred_factor, plain, stated_factor, trained_len

__all__ = ["yarn_correction_range"]


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(dim: int, base: float, trained: int, beta_fast: float, beta_slow: float,
                          truncate: bool = True) -> tuple[float, float]:
    """YaRN's ramp ends ``(low, high)`` as pair indices (HF's ``find_correction_range``):
    ``d_c(n) = dim * ln(trained / (2 pi n)) / (2 ln base)`` is the pair whose wavelength fits ``n`` times in
    ``trained``; ``low = d_c(beta_fast)``, ``high = d_c(beta_slow)`` (floor/ceil with ``truncate``), clipped to
    ``[0, dim - 1]``, ``high + 0.001`` when they meet (no zero-width ramp)."""

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(trained / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF: prevent a zero-width ramp
    return low, high


def _yarn_core(dim: int, base: float, factor: float, trained: int, params: dict) -> RopeFrequencies:
    """YaRN "NTK-by-parts" frequencies and attention factor, step for step as HF's yarn function.

    Refuses ``beta_fast <= beta_slow``."""
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:  # HF's truthiness test: 0 means "not given"
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32  # HF's `or`: we refuse 0 earlier, so only None -> default
    beta_slow = params.get("beta_slow") or 1
    if beta_fast <= beta_slow:
        raise ValueError(f"scaling['beta_fast'] must be > beta_slow ({beta_slow}), got {beta_fast}")

    low, high = yarn_correction_range(dim, base, trained, beta_fast, beta_slow, params.get("truncate", True))
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = default_inv_freq(dim, base)  # [dim/2]
    extrapolation_weight = 1 - ramp  # 1 for fast (high-frequency) pairs: left alone
    inv_freq = extrapolation / factor * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return RopeFrequencies(inv_freq, float(attention))


_YARN_KEYS = ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")


def _yarn_factor(params, seq_len):
    """``factor``, else ``max_position_embeddings / original_max_position_embeddings`` (one of them required)."""
    factor = inferred_factor(params)
    return stated_factor(params, "yarn") if factor is None else factor


@register("yarn", _YARN_KEYS, factor=_yarn_factor)
def _yarn(head_dim, dim, base, params, seq_len):
    """YaRN: ``theta_i' = ((1 - g_i) / s + g_i) theta_i``, ``g_i`` a ramp over pair index; scale 0.1 ln s + 1.

    arXiv 2309.00071. Equals HF ``_compute_yarn_parameters``: ramp between the pairs that turn
    ``beta_fast`` (32) and ``beta_slow`` (1) times over L (``truncate`` floors/ceils the bounds),
    ``attention_factor`` if given, else ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` when both are
    non-zero (DeepSeek), else ``0.1 ln s + 1``. Missing ``factor`` is inferred as
    ``max_position_embeddings / original_max_position_embeddings`` like HF.
    """
    trained = trained_len(params, "yarn")
    return _yarn_core(dim, base, _yarn_factor(params, seq_len), trained, params)


def _dynamic_yarn_factor(params, seq_len):
    """``max(1, t / L)``; ``seq_len`` required."""
    require_seq_len("dynamic_yarn", seq_len)
    trained = trained_len(params, "dynamic_yarn")
    if seq_len <= trained:
        return 1.0
    return max(1.0, seq_len / trained)


@register("dynamic_yarn", tuple(k for k in _YARN_KEYS if k != "factor"), dynamic=True, factor=_dynamic_yarn_factor)
def _dynamic_yarn(head_dim, dim, base, params, seq_len):
    """Dynamic YaRN: YaRN with ``s = max(1, seq_len / L)``; exactly default (scale 1) for seq_len <= L.

    arXiv 2309.00071 section 3.3 (and the authors' ``LlamaDynamicYaRNScaledRotaryEmbedding``). One ``s``
    per call from ``seq_len`` (the last token's ``max(L, pos + 1) / L``), not per token: per-token
    frequencies would break relative positions inside the KV cache. ``attention_factor``, if given,
    replaces the mscale beyond L (HF's yarn semantics; the YaRN repo multiplies instead). Not in HF.
    """
    trained = trained_len(params, "dynamic_yarn")
    if seq_len <= trained:
        return plain(dim, base)
    return _yarn_core(dim, base, seq_len / trained, trained, params)
