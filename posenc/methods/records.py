"""The records of the method registry: :class:`Param` (one parameter) and :class:`Method` (one method), both
built with keyword arguments only. The registry and the ``"a+b"`` parser are :mod:`posenc.methods.registry`; each
family's records and how they apply are the other modules of :mod:`posenc.methods`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LengthDefaults", "Method", "Param", "Scheme"]

Scheme = Any  # a posenc.scheme.core.PositionScheme


def _is_heads(value) -> bool:
    """A list of distinct head indices (integers >= 0)."""
    return (
        isinstance(value, (list, tuple))
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)
        and len(set(value)) == len(value)
    )


# ===================================================================== records
@dataclass(frozen=True, kw_only=True)
class Param:
    """One parameter of a method. ``default`` is the value used when it is not given; when that is not a
    constant, ``rule`` says how it is chosen (``"required"``, ``"train_len // 2"``, ...) and
    ``from_train_len`` computes it. ``minimum``/``maximum`` (``strict``: minimum excluded, ``integer``)
    are the range the part validates (``strict_max``: maximum excluded). ``filled``: the method writes
    the default into the scheme."""

    name: str
    default: Any = None
    rule: str = ""
    minimum: float | None = None
    maximum: float | None = None
    strict: bool = False
    strict_max: bool = False
    integer: bool = False
    filled: bool = False
    from_train_len: Callable[[int], Any] | None = None
    choices: tuple | None = None  # a value among these names (not a number)
    heads: bool = False  # a list of head indices, or one such list per layer
    original: str = ""  # the original implementation's parameter this one maps to (docs/guides/conventions.md)
    calibration: str = ""  # the procedure that finds its value on a model ("calibrate" in a suite preset)
    required: bool = False  # no default: the method refuses to apply without it (``rule`` says what to give)

    def default_for(self, train_len: int):
        """The default at ``train_len`` (None: required, or applied by the part)."""
        return self.from_train_len(train_len) if self.from_train_len is not None else self.default

    def contains(self, value) -> bool:
        """True when ``value`` is inside the documented range (one of ``choices``; a head list for ``heads``)."""
        if self.choices is not None:
            return isinstance(value, str) and value in self.choices
        if self.heads:
            return _is_heads(value) or (
                isinstance(value, (list, tuple)) and bool(value) and all(_is_heads(v) for v in value)
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return isinstance(value, bool) and self.minimum is None and self.maximum is None
        if not math.isfinite(value) or self.integer and not float(value).is_integer():
            return False
        if self.minimum is not None and (value <= self.minimum if self.strict else value < self.minimum):
            return False
        return self.maximum is None or (value < self.maximum if self.strict_max else value <= self.maximum)

    def checked(self, method: str, value, train_len: int | None = None):
        """``value`` when it is inside the documented range (:meth:`contains`; an integer parameter as an int),
        the default at ``train_len`` for None, else a ``ValueError`` naming ``method.name`` and the range."""
        if value is None:
            return self.default_for(train_len)
        if not self.contains(value):
            rng = self.range_text().replace(", ", " and ")
            rng = (
                f"one of {list(self.choices)}"
                if self.choices is not None
                else "true or false"
                if rng == "true/false"
                else f"an {rng}"
                if self.integer
                else rng
            )
            raise ValueError(f"{method}.{self.name} must be {rng}, got {value!r}")
        return int(value) if self.integer else value

    def range_text(self) -> str:
        """The allowed values alone: ``"integer >= 1"``, ``">= 0, <= 1"``, ``"true/false"``, the choices, or ``""``."""
        lo = "" if self.minimum is None else f"{'>' if self.strict else '>='} {self.minimum:g}"
        hi = "" if self.maximum is None else f"{'<' if self.strict_max else '<='} {self.maximum:g}"
        rng = ", ".join(x for x in (lo, hi) if x)
        if self.choices is not None:
            return " | ".join(self.choices)
        if self.heads:
            return "head indices, or one list per layer"
        if isinstance(self.default, bool):
            return "true/false"
        return f"integer {rng}".strip() if self.integer else rng

    def describe(self) -> str:
        """``"window=train_len // 2 (integer >= 1)"``."""
        default = self.rule or repr(self.default)
        rng = self.range_text()
        orig = f" [original: {self.original}]" if self.original else ""
        return f"{self.name}={default}" + (f" ({rng})" if rng else "") + orig


# fn(train_len, eval_len, head_dim, base) -> parameters
LengthDefaults = Callable[[int, int, "int | None", float], dict]


@dataclass(frozen=True, kw_only=True)
class Method:
    """One method (see the module docstring): inference-time in :data:`METHODS`, trained-in in
    :data:`TRAINED_METHODS`."""

    name: str
    kind: str  # "frequencies" | "base" | "remap" | "scale" | "mask" | "embedding" | "identity"; trained-in
    #            (TRAINED_METHODS): "bias" | "relative" | "gate"
    description: str
    paper: str  # "arXiv:NNNN.NNNNN", or the URL of the post that introduced it
    apply: Callable[..., Scheme] | None  # fn(method, scheme, **params) -> scheme; None: transformers only
    params: tuple[Param, ...] = ()
    sets: tuple[str, ...] = ()  # the PositionScheme fields it changes
    scaling_type: str | None = None  # posenc.parts.frequencies rope_type it writes into rope.scaling
    remap_kind: str | None = None  # posenc.parts.remap kind it sets
    dynamic: bool = False  # the frequencies depend on the sequence length
    base_preset: str = "rope"  # the trained-in preset it applies to (tests, `posenc schemes`)
    eval_defaults: LengthDefaults | None = None  # per-length defaults (lab evaluation); None: no parameters
    hf_rope_type: str | None = None  # transformers' rope_type for the same schedule, where it has one
    hf_native: bool = False  # posenc.hf.extend runs transformers' own code for it (unless native=False)
    hf_original_len: bool = False  # transformers reads original_max_position_embeddings for it
    aliases: tuple[str, ...] = ()
    original: str = ""  # the reference implementation its parameters are mapped to ("owner/repo file")

    @property
    def is_identity(self) -> bool:
        return self.kind == "identity"

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def filled_defaults(self, train_len: int | None = None) -> dict:
        """The defaults the method writes into the scheme (``train_len`` for the length-derived ones)."""
        return {p.name: p.default_for(train_len) for p in self.params if p.filled}

    def length_defaults(
        self, train_len: int, eval_len: int, head_dim: int | None = None, base: float = 10000.0
    ) -> dict:
        """Parameters to evaluate at ``eval_len`` a model trained at ``train_len`` (see
        :func:`posenc.methods.length_defaults`)."""
        return {} if self.eval_defaults is None else self.eval_defaults(train_len, eval_len, head_dim, base)

    def build(self, scheme: Scheme, **params) -> Scheme:
        if self.apply is None:
            raise ValueError(f"method {self.name!r} exists only in transformers (posenc.hf.extend)")
        return self.apply(self, scheme, **params)
