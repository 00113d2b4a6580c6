"""The schedule record and the registry: one ``(inv_freq function, factor function)`` pair per ``rope_type``.

A schedule is ``fn(head_dim, rotary_dim, base, params, seq_len) -> RopeFrequencies`` (``params`` already
validated, ``base`` already ``rope_theta``); its factor is ``factor(params, seq_len) -> float``, the effective
context-extension scale ``s`` it applies (1.0 when unscaled). :func:`register` files both, with the keys the
rope_type reads (every other key is refused) and whether its result depends on ``seq_len``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["COMMON_KEYS", "DYNAMIC", "FACTORS", "KEYS", "LENGTH_KEYS", "ROPE_SCALINGS", "Factor", "RopeFrequencies",
           "Schedule", "register", "require_seq_len", "unscaled"]


@dataclass(frozen=True)
class RopeFrequencies:
    """Inverse frequencies ``inv_freq`` (float32 ``[rotary_dim // 2]``) and ``attention_scale``.

    ``attention_scale`` multiplies cos and sin (HF's ``attention_scaling``), so the logits q.k are
    multiplied by ``attention_scale ** 2``; it is 1.0 except for YaRN and LongRoPE.
    """

    inv_freq: torch.Tensor
    attention_scale: float = 1.0

    @property
    def rotary_dim(self) -> int:
        """Number of head dims rotated with these frequencies (``2 * len(inv_freq)``)."""
        return 2 * int(self.inv_freq.numel())


# fn(head_dim, rotary_dim, base, params, seq_len): params validated by the parser, base already rope_theta
Schedule = Callable[[int, int, float, dict, "int | None"], RopeFrequencies]
# factor(params, seq_len): the effective scale s; seq_len already checked (an int >= 1 or None)
Factor = Callable[[dict, "int | None"], float]

ROPE_SCALINGS: dict[str, Schedule] = {}
FACTORS: dict[str, Factor] = {}  # how each rope_type's effective factor is computed
KEYS: dict[str, frozenset[str]] = {}  # keys each rope_type reads (others are refused)
DYNAMIC: set[str] = set()  # rope types whose result depends on seq_len

# Keys every rope_type accepts. mrope_* only choose which position axis drives which frequency band
# (Qwen2-VL), so they do not change inv_freq.
COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor",
                         "max_position_embeddings", "original_max_position_embeddings",
                         "mrope_section", "mrope_interleaved", "resonance"})
LENGTH_KEYS = ("original_max_position_embeddings", "max_position_embeddings")


def register(name: str, keys: tuple[str, ...] = (), dynamic: bool = False, *, factor: Factor):
    """Decorator filing a schedule under ``name`` with its ``factor`` function, the keys it reads beyond
    :data:`COMMON_KEYS`, and ``dynamic`` (its result depends on ``seq_len``)."""
    def wrap(fn: Schedule) -> Schedule:
        ROPE_SCALINGS[name] = fn
        FACTORS[name] = factor
        KEYS[name] = COMMON_KEYS | frozenset(keys)
        if dynamic:
            DYNAMIC.add(name)
        return fn
    return wrap


def unscaled(params: dict, seq_len: int | None) -> float:
    """The factor of a schedule that extends nothing: 1.0."""
    return 1.0


def require_seq_len(rope_type: str, seq_len: int | None) -> None:
    """Refuse ``seq_len=None`` for a rope_type whose result depends on it."""
    if seq_len is None:
        raise ValueError(f"seq_len is required for rope_type {rope_type!r} (its frequencies depend on the "
                         "sequence length); pass seq_len = max(position) + 1, an integer >= 1")
