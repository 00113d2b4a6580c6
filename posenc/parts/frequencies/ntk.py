"""The NTK family, which raises the base (or, for ``ntk_mixed``, bends the ladder): ``ntk`` (fixed),
``ntk_mixed``, ``dynamic`` (HF's dynamic NTK) and ``dynamic_qwen`` (Qwen's)."""

from __future__ import annotations

import math

import torch

from posenc.parts.frequencies.registry import RopeFrequencies, register, require_seq_len
from posenc.parts.frequencies.shared import default_inv_freq, plain, stated_factor, trained_len


def ntk_base(base: float, scale: float, dim: int) -> float:
    """NTK-aware base ``base * scale ** (d/(d-2))``: divides the lowest frequency by exactly ``scale``.

    Refuses ``dim < 4`` and a base that overflows."""
    if dim < 4:
        raise ValueError(f"rotary_dim must be >= 4 for NTK-style base scaling (exponent d/(d-2)), got {dim}")
    log_base = math.log(base) + math.log(scale) * dim / (dim - 2)  # in logs: scale=1e300 must not overflow
    new_base = math.exp(log_base) if log_base < 700 else math.inf
    if not math.isfinite(new_base):
        raise ValueError(f"NTK-scaled base {base} * {scale} ** (d/(d-2)) overflows; use a smaller base/scale")
    return new_base


def _ntk_factor(params, seq_len):
    """``alpha`` when given, else ``factor`` (required)."""
    if "alpha" in params:
        return params["alpha"]
    return stated_factor(params, "ntk")


@register("ntk", ("factor", "alpha"), factor=_ntk_factor)
def _ntk(head_dim, dim, base, params, seq_len):
    """Fixed NTK-aware scaling: ``base' = base * s ** (d/(d-2))`` (bloc97, reddit r/LocalLLaMA 14lz7j5, 2023).

    ``s`` is ``factor`` (length ratio L_test / L_train; the lowest frequency is then divided by exactly
    ``factor``) or, instead, ``alpha``: the "NTK alpha" of bloc97's post, Qwen's ``ntk_alpha`` and
    CodeLlama-era scripts, used in the same formula, exponent ``d/(d-2)`` included (alpha is a tuning knob,
    usually set larger than the length ratio). Refuses both given. For a plain base multiplier use
    ``rope_type='base'``.
    """
    if "alpha" in params and "factor" in params:
        raise ValueError("scaling for rope_type 'ntk' takes either 'factor' or 'alpha', not both")
    scale = params["alpha"] if "alpha" in params else stated_factor(params, "ntk")
    return plain(dim, ntk_base(base, scale, dim))


def _ntk_mixed_factor(params, seq_len):
    """``factor`` (required)."""
    return stated_factor(params, "ntk_mixed")


@register("ntk_mixed", ("factor", "b"), factor=_ntk_mixed_factor)
def _ntk_mixed(head_dim, dim, base, params, seq_len):
    """NTK-RoPE-mixed: ``theta_i = base ** (-2i/d) * exp(-a (i+1) ** b)``, ``a = ln(factor) / (d/2) ** b``.

    Su Jianlin, kexue.fm/archives/9706; reference ``ntk_patch.py`` in github.com/bojone/rerope
    (``b = 0.75`` there, key ``b`` here). The lowest frequency (i = d/2 - 1) is divided by exactly
    ``factor``; the highest (i = 0) by only ``exp(a)``. Not in HF.
    """
    factor = stated_factor(params, "ntk_mixed")
    b = params.get("b", 0.75)
    a = math.log(factor) / (dim / 2) ** b
    i1 = torch.arange(1, dim // 2 + 1, dtype=torch.float64)  # i + 1
    return RopeFrequencies(default_inv_freq(dim, base) * torch.exp(-a * i1 ** b), 1.0)


def _dynamic_factor(params, seq_len):
    """``max(1, factor * t / L - (factor - 1))`` beyond L, 1 inside; ``seq_len`` required."""
    require_seq_len("dynamic", seq_len)
    trained = trained_len(params, "dynamic")
    if seq_len <= trained:  # inside the trained length the schedule is the default one
        return 1.0
    factor = stated_factor(params, "dynamic")  # factor * t / L - (factor - 1) rounds to 1 + 7e-15 at t = L
    return max(1.0, factor * seq_len / trained - (factor - 1))


@register("dynamic", ("factor",), dynamic=True, factor=_dynamic_factor)
def _dynamic(head_dim, dim, base, params, seq_len):
    """Dynamic NTK: ``base' = base * (factor * t / L - (factor - 1)) ** (d/(d-2))`` for t > L, else default.

    emozilla, reddit r/LocalLLaMA 14mrgpr (2023). Matches HF ``_compute_dynamic_ntk_parameters``
    with ``t = max(seq_len, L)``. HF takes L from ``config.max_position_embeddings``; we read
    ``original_max_position_embeddings`` first, then ``max_position_embeddings`` from ``scaling``.
    Inside the trained length the result is exactly the default schedule.
    """
    factor, L = stated_factor(params, "dynamic"), trained_len(params, "dynamic")
    if seq_len <= L:
        return plain(dim, base)
    return plain(dim, ntk_base(base, factor * seq_len / L - (factor - 1), dim))


def qwen_alpha(seq_len: int, trained: int) -> int:
    """``max(1, 2 ** (ceil(log2(t / T)) + 1) - 1)``, computed exactly with integers.

    ``ceil(log2(t/T))`` is the smallest k with ``2**k >= t/T``, i.e. ``ceil(log2(ceil(t/T)))``.
    """
    if seq_len <= trained:
        return 1
    k = (-(-seq_len // trained) - 1).bit_length()
    return 2 ** (k + 1) - 1


def _dynamic_qwen_factor(params, seq_len):
    """``alpha_t`` beyond T, 1 inside; ``seq_len`` required."""
    require_seq_len("dynamic_qwen", seq_len)
    trained = trained_len(params, "dynamic_qwen")
    if seq_len <= trained:
        return 1.0
    return float(qwen_alpha(seq_len, trained))


@register("dynamic_qwen", dynamic=True, factor=_dynamic_qwen_factor)
def _dynamic_qwen(head_dim, dim, base, params, seq_len):
    """Qwen dynamic NTK: ``base' = base * a_t ** (d/(d-2))``, ``a_t = max(1, 2**(ceil(log2(t/T)) + 1) - 1)``.

    Qwen-7B ``modeling_qwen.py`` (``context_value = log2(t/T) + 1; ntk_alpha = max(2**ceil(.) - 1, 1)``),
    evaluated exactly in integers (Qwen's float ``log`` could round at exact powers of two).
    ``t = seq_len``, ``T = original_max_position_embeddings``. Not in HF.
    """
    alpha = qwen_alpha(seq_len, trained_len(params, "dynamic_qwen"))
    return plain(dim, base if alpha == 1 else ntk_base(base, alpha, dim))
