"""The entry points over the registry: :func:`rope_frequencies`, :func:`validate_rope_scaling`,
:func:`is_dynamic` and :func:`scaling_factor`, each reading a Hugging Face ``rope_scaling`` dict."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from posenc._util import check_finite, check_positive_int
from posenc.parts.frequencies.config import check_partial, check_seq_len, parse, require_dynamic_seq_len
from posenc.parts.frequencies.registry import DYNAMIC, FACTORS, ROPE_SCALINGS, RopeFrequencies
from posenc.parts.frequencies.shared import trained_len
from posenc.parts.resonance import resonance

__all__ = ["is_dynamic", "rope_frequencies", "scaling_factor", "validate_rope_scaling"]


def rope_frequencies(head_dim: int, base: float = 10000.0, scaling: Mapping | None = None,
                     seq_len: int | None = None, partial_rotary_factor: float = 1.0) -> RopeFrequencies:
    """RoPE inverse frequencies and attention scale for a HF-style ``scaling`` dict.

    ``theta_i = base ** (-2i / rotary_dim)`` transformed by ``ROPE_SCALINGS[rope_type]``, with
    ``rotary_dim = int(head_dim * partial_rotary_factor)`` (even, >= 2). ``rope_type`` (or legacy
    ``type``) defaults to ``"default"``; ``scaling['rope_theta']`` and
    ``scaling['partial_rotary_factor']``, when present, override ``base`` and ``partial_rotary_factor``.
    Returns a :class:`RopeFrequencies`, not a tensor: ``.inv_freq`` (float32 ``[rotary_dim // 2]``; ``proportional``:
    ``[head_dim // 2]``) and ``.attention_scale`` (1.0 except for YaRN and LongRoPE).
    Raises ``ValueError`` for any out-of-range input (see :mod:`posenc.parts.frequencies`).
    """
    head_dim = check_positive_int("head_dim", head_dim)
    rope_type, params = parse(scaling)
    base = check_finite("scaling['rope_theta']" if "rope_theta" in params else "base",
                        params.get("rope_theta", base), minimum=0.0, strict_min=True)
    partial = params.get("partial_rotary_factor", check_partial(partial_rotary_factor))
    rotary_dim = int(head_dim * partial)
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim = int(head_dim * partial_rotary_factor) must be an even integer >= 2, "
                         f"got head_dim={head_dim}, partial_rotary_factor={partial} -> {rotary_dim}")
    seq_len = check_seq_len(seq_len)
    require_dynamic_seq_len(rope_type, seq_len)
    return _compute(rope_type, params, head_dim, rotary_dim, base, seq_len)


def _compute(rope_type: str, params: dict, head_dim: int, rotary_dim: int, base: float,
             seq_len: int | None) -> RopeFrequencies:
    out = ROPE_SCALINGS[rope_type](head_dim, rotary_dim, base, params, seq_len)
    inv_freq = out.inv_freq
    inv_freq = resonance(inv_freq, params.get("resonance", False))
    if not bool(torch.isfinite(inv_freq).all()) or bool((inv_freq < 0).any()):
        raise ValueError(f"rope_type {rope_type!r} with base={base} and rotary_dim={rotary_dim} gives "
                         "non-finite or negative frequencies; use a base in a sane range (e.g. 10 .. 1e9)")
    if not (math.isfinite(out.attention_scale) and out.attention_scale > 0):
        raise ValueError(f"rope_type {rope_type!r} gives attention scale {out.attention_scale}; "
                         "scaling['attention_factor'] / mscale must give a finite scale > 0")
    return RopeFrequencies(inv_freq.to(torch.float32), float(out.attention_scale))


def validate_rope_scaling(scaling: Mapping | None, head_dim: int | None = None, base: float = 10000.0,
                          partial_rotary_factor: float = 1.0) -> dict:
    """Check a HF-style ``rope_scaling`` dict completely, before anything uses it; return it normalised.

    Refuses (``ValueError`` naming the key and its allowed range): a non-dict, an unknown ``rope_type``
    or key, a missing required key, NaN/inf, ``factor`` < 1, ``low_freq_factor >= high_freq_factor``,
    ``beta_fast <= beta_slow``, a negative ``mscale``, LongRoPE ``short_factor``/``long_factor`` lists
    whose lengths differ (or, with ``head_dim``, are not ``rotary_dim // 2`` long), and values whose
    frequencies overflow. It runs the schedule itself at the lengths that choose its branches, so a
    config accepted here is one :func:`rope_frequencies` accepts. Without ``head_dim`` the rotary
    dimension is taken from the LongRoPE lists (else 64). Returns ``{"rope_type": ..., **params}``
    with None values dropped; ``{"rope_type": "default"}`` for ``None``.
    """
    rope_type, params = parse(scaling)
    base = check_finite("base", params.get("rope_theta", base), minimum=0.0, strict_min=True)
    if head_dim is None:
        rotary_dim = 2 * len(params.get("short_factor", ())) or 64
        head_dim = rotary_dim
    else:
        head_dim = check_positive_int("head_dim", head_dim)
        partial = params.get("partial_rotary_factor", check_partial(partial_rotary_factor))
        rotary_dim = int(head_dim * partial)
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"rotary_dim = int(head_dim * partial_rotary_factor) must be an even integer >= 2, "
                             f"got head_dim={head_dim}, partial_rotary_factor={partial} -> {rotary_dim}")
    lengths: tuple[int | None, ...] = (None,)
    if rope_type in DYNAMIC:
        trained = trained_len(params, rope_type)
        lengths = (trained, trained + 1)  # inside and beyond the trained length (longrope: short and long)
    for seq_len in lengths:
        _compute(rope_type, params, head_dim, rotary_dim, base, seq_len)
    return {"rope_type": rope_type, **{k: v for k, v in params.items() if k not in ("rope_type", "type")}}


def is_dynamic(scaling: Mapping | None) -> bool:
    """True when the schedule depends on ``seq_len`` (dynamic, dynamic_qwen, dynamic_yarn, longrope)."""
    return parse(scaling)[0] in DYNAMIC


def scaling_factor(scaling: Mapping | None, seq_len: int | None = None) -> float:
    """The effective context-extension scale ``s`` a schedule applies (1.0 for an unscaled one), as its
    registered factor function computes it.

    default / base: 1; linear, ntk_mixed, yarn, llama3, proportional, longrope: ``factor`` (yarn /
    longrope infer it as ``max_position_embeddings / original_max_position_embeddings`` when absent;
    proportional defaults to 1); ntk: ``alpha`` or ``factor``; at a given ``seq_len`` (required for them):
    dynamic ``max(1, factor * t / L - (factor - 1))``, dynamic_qwen ``alpha_t``, dynamic_yarn
    ``max(1, t / L)``, each 1 for ``t <= L``. Useful for logit scales that follow the extension (e.g. log-n)
    and for reports.
    """
    rope_type, params = parse(scaling)
    return FACTORS[rope_type](params, check_seq_len(seq_len))
