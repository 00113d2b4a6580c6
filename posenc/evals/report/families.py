"""Method families and their colours: one hue per family, a distinct shade per row within it.

A report row is a trained scheme, or an inference-time method applied to one. Its family comes from the
registries, not from a list of names:

- a method row: the :class:`~posenc.methods.records.Method` records of its composition (``kind``:
  ``frequencies``/``base``/``logn`` -> RoPE + frequency methods, ``remap`` -> position remaps, ``mask`` -> masks /
  windows, ``embedding`` -> trained-in absolute); in a composition the most specific part wins (a mask over a
  remap over a frequency change: ``rerope+logn`` is a remap);
- a trained row: the parts of ``PositionScheme.preset(scheme)`` (a bias part -> attention biases; a relative,
  gate or memory part -> relative / gates / memory; a rotary part -> RoPE; an absolute embedding -> trained-in
  absolute; none -> NoPE); a fine-tune of the bench (``meta.config.finetunes``) -> fine-tuned.

:func:`palette` gives every row of a figure its colour and marker; no two rows share a colour.
"""

from __future__ import annotations

import colorsys
from collections.abc import Iterable

from posenc.methods import UnknownMethodError, is_identity, parse_methods

__all__ = ["FAMILIES", "family", "family_of_method", "family_of_scheme", "palette"]

ABSOLUTE, ROPE, REMAP, MASK = "trained-in absolute", "RoPE + frequency methods", "position remaps", "masks / windows"
BIAS, RELATIVE, FINETUNED, NOPE, OTHER = ("attention biases", "relative / gates / memory", "fine-tuned",
                                          "NoPE", "other")
# family -> (hue, saturation, lightest shade) of its shades (darkest 0.22); grey families have saturation 0.
# Order = legend order.
FAMILIES: dict[str, tuple[float, float, float]] = {
    ROPE: (0.60, 0.80, 0.60), REMAP: (0.33, 0.75, 0.55), MASK: (0.07, 0.90, 0.58), ABSOLUTE: (0.14, 0.85, 0.40),
    BIAS: (0.77, 0.60, 0.62), RELATIVE: (0.90, 0.70, 0.60), FINETUNED: (0.50, 0.85, 0.42), NOPE: (0.0, 0.0, 0.45),
    OTHER: (0.03, 0.35, 0.50)}
_KIND = {"frequencies": ROPE, "base": ROPE, "scale": ROPE, "remap": REMAP, "mask": MASK, "embedding": ABSOLUTE,
         "bias": BIAS, "relative": RELATIVE, "gate": RELATIVE}
_SPECIFIC = (MASK, REMAP, ABSOLUTE, BIAS, RELATIVE, ROPE)  # a composition takes the first of these it has
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")


def family_of_method(method: str) -> str:
    """The family of an inference-time method or composition ``a+b`` (module docstring); OTHER when unknown."""
    try:
        kinds = {_KIND.get(m.kind, OTHER) for m in parse_methods(method, identity=False)}
    except (UnknownMethodError, ValueError):
        return OTHER
    return next((f for f in _SPECIFIC if f in kinds), OTHER)


def family_of_scheme(scheme: str, finetunes: Iterable[str] = ()) -> str:
    """The family of a trained scheme by the parts of its preset (module docstring); FINETUNED for a name in
    ``finetunes``; OTHER for a name that is no preset."""
    if scheme in set(finetunes):
        return FINETUNED
    from posenc.scheme.core import PositionScheme

    try:
        s = PositionScheme.preset(str(scheme).split(":")[0], train_len=64)
    except (ValueError, TypeError):
        return OTHER
    if s.bias is not None:
        return BIAS
    if s.relative is not None or s.gate is not None or s.memory is not None:
        return RELATIVE
    if s.rope is not None:
        return ROPE
    return ABSOLUTE if s.embedding.kind != "nope" else NOPE


def family(scheme: str, method, finetunes: Iterable[str] = ()) -> str:
    """The family of a report row: its method's when one is applied, else its trained scheme's."""
    return family_of_scheme(scheme, finetunes) if is_identity(method) else family_of_method(str(method))


def _shade(hue: float, sat: float, lightest: float, i: int, n: int) -> tuple[float, float, float]:
    light = (0.22 + lightest) / 2 if n == 1 else 0.22 + (lightest - 0.22) * i / (n - 1)
    return colorsys.hls_to_rgb(hue, light, sat)


def palette(rows: Iterable[tuple[str, object]], finetunes: Iterable[str] = ()) -> dict[tuple, dict]:
    """``{(scheme, method): {"family", "color", "marker"}}`` for the rows of one figure: the family's hue, a shade
    per row (darkest first, in the order given), a marker cycling within the family. Colours are distinct."""
    rows = list(dict.fromkeys(rows))
    finetunes = tuple(finetunes)
    fams = {row: family(row[0], row[1], finetunes) for row in rows}
    out: dict[tuple, dict] = {}
    for fam, (hue, sat, lightest) in FAMILIES.items():
        members = [row for row in rows if fams[row] == fam]
        for i, row in enumerate(members):
            out[row] = {"family": fam, "color": _shade(hue, sat, lightest, i, len(members)),
                        "marker": MARKERS[i % len(MARKERS)]}
    return out
