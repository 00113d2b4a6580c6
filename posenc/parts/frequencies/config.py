"""Reading a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict: ``(rope_type, params)`` with every value
checked, and the checks on ``seq_len`` and ``partial_rotary_factor``.

Refuses (``ValueError`` naming the key and its allowed range) a non-dict, a dict nested by layer type, an
unknown ``rope_type`` or a key it does not read, ``type`` and ``rope_type`` that disagree, NaN/inf anywhere,
lengths that are not integers >= 1, ``factor``/``alpha`` < 1, other numbers <= 0, a negative ``mscale``,
``partial_rotary_factor`` outside (0, 1], a non-bool ``truncate``, and empty or non-positive LongRoPE lists.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real

import torch

from posenc._util import check_finite, check_positive_int
from posenc.parts.frequencies.registry import DYNAMIC, KEYS, ROPE_SCALINGS, require_seq_len

__all__ = ["check_partial", "check_seq_len", "parse", "require_dynamic_seq_len"]

_POSITIVE_INT_KEYS = ("original_max_position_embeddings", "max_position_embeddings")
_POSITIVE_KEYS = ("rope_theta", "base", "low_freq_factor", "high_freq_factor", "b", "attention_factor",
                  "beta_fast", "beta_slow")
_AT_LEAST_ONE_KEYS = ("factor", "alpha")


def _check_numbers(name: str, value) -> None:
    """Refuse NaN/inf anywhere (numbers, nested lists, 0-d tensors)."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_numbers(f"{name}[{i}]", v)
    elif isinstance(value, Real) and not isinstance(value, bool) and not math.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value}")


def parse(scaling) -> tuple[str, dict]:
    """Validate a rope_scaling / rope_parameters dict; return ``(rope_type, params)``, None values dropped."""
    if scaling is None:
        return "default", {}
    if not isinstance(scaling, Mapping):
        raise ValueError(f"scaling must be a dict (HF rope_scaling / rope_parameters) or None, got "
                         f"{type(scaling).__name__}")
    params = {k: v for k, v in scaling.items() if v is not None}
    if params and all(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(f"scaling is nested by layer type ({sorted(params)}); pass one of them, "
                         "e.g. scaling['full_attention']")
    for key, value in params.items():
        _check_numbers(f"scaling[{key!r}]", value)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if "type" in params and "rope_type" in params and params["type"] != params["rope_type"]:
        raise ValueError(f"scaling['type'] ({params['type']!r}) and scaling['rope_type'] "
                         f"({params['rope_type']!r}) disagree")
    if rope_type not in ROPE_SCALINGS:
        raise ValueError(f"scaling['rope_type'] must be one of {sorted(ROPE_SCALINGS)}, got {rope_type!r}")
    unknown = sorted(set(params) - KEYS[rope_type])
    if unknown:
        raise ValueError(f"scaling has keys {unknown} that rope_type {rope_type!r} does not use; "
                         f"allowed keys: {sorted(KEYS[rope_type])}")
    for key in _POSITIVE_INT_KEYS:
        if key in params:
            params[key] = check_positive_int(f"scaling[{key!r}]", params[key])
    for key in _POSITIVE_KEYS:
        if key in params:
            params[key] = check_finite(f"scaling[{key!r}]", params[key], minimum=0.0, strict_min=True)
    for key in _AT_LEAST_ONE_KEYS:
        if key in params:
            params[key] = check_finite(f"scaling[{key!r}]", params[key], minimum=1.0)
    for key in ("mscale", "mscale_all_dim"):  # 0.1 * mscale * ln(s) + 1 must stay >= 1: no negative scale
        if key in params:
            params[key] = check_finite(f"scaling[{key!r}]", params[key], minimum=0.0)
    if "partial_rotary_factor" in params:
        params["partial_rotary_factor"] = check_partial(params["partial_rotary_factor"],
                                                        "scaling['partial_rotary_factor']")
    if "truncate" in params and not isinstance(params["truncate"], bool):
        raise ValueError(f"scaling['truncate'] must be true or false, got {params['truncate']!r}")
    for key in ("short_factor", "long_factor"):
        if key in params:
            values = params[key]
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"scaling[{key!r}] must be a non-empty list of numbers > 0, got {values!r}")
            params[key] = [check_finite(f"scaling[{key!r}][{i}]", v, minimum=0.0, strict_min=True)
                           for i, v in enumerate(values)]
    return rope_type, params


def check_partial(value, name: str = "partial_rotary_factor") -> float:
    """``partial_rotary_factor`` as a float in (0, 1]."""
    return check_finite(name, value, minimum=0.0, maximum=1.0, strict_min=True)


def check_seq_len(seq_len) -> int | None:
    """``seq_len`` as an int >= 1 (a one-element integer tensor accepted), or None."""
    if seq_len is None:
        return None
    if isinstance(seq_len, torch.Tensor) and seq_len.numel() == 1 and not seq_len.is_floating_point():
        seq_len = int(seq_len)  # HF's dynamic update passes max(position_ids) + 1 as a tensor
    return check_positive_int("seq_len", seq_len)


def require_dynamic_seq_len(rope_type: str, seq_len: int | None) -> None:
    """Refuse ``seq_len=None`` for a rope_type whose result depends on it."""
    if rope_type in DYNAMIC:
        require_seq_len(rope_type, seq_len)
