"""``Part``: a registry-backed part of a scheme (a kind name and its constructor parameters), and the
checks of JSON-like configs that :mod:`posenc.scheme.core` and :mod:`posenc.methods` share."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def _check_params(where: str, params: dict) -> dict:
    """Refuse NaN/inf anywhere in a config (HF silently propagates them)."""
    for key, value in params.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{where}.{key} must be finite, got {value}")
        if isinstance(value, dict):
            _check_params(f"{where}.{key}", value)
        if isinstance(value, (list, tuple)):
            for v in value:
                if isinstance(v, float) and not math.isfinite(v):
                    raise ValueError(f"{where}.{key} must contain only finite numbers")
    return params


def _check_keys(where: str, d: dict, known) -> None:
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {unknown}; known: {sorted(known)}")


@dataclass(frozen=True)
class Part:
    """A registry-backed part: ``kind`` names the class, ``params`` its constructor arguments."""

    kind: str
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(f"part kind must be a non-empty string, got {self.kind!r}")
        _check_params(self.kind, dict(self.params))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, d, where: str = "part") -> Part | None:
        """``None``, a kind name, or ``{"kind": str, "params": dict}`` (``where`` names the field in errors)."""
        if d is None:
            return None
        if isinstance(d, str):
            return cls(d)
        if not isinstance(d, dict):
            raise ValueError(f"{where} must be a kind name, a {{'kind', 'params'}} dict or null, got {d!r}")
        _check_keys(where, d, ("kind", "params"))
        if "kind" not in d:
            raise ValueError(f"{where} needs a 'kind' (a registered name), got keys {sorted(d)}")
        params = d.get("params", {})
        if not isinstance(params, dict):
            raise ValueError(f"{where}.params must be a dict of parameters, got {params!r}")
        return cls(d["kind"], dict(params))
