"""The conventions table: for every remap and mask method of the registry, each parameter and the parameter of
the original implementation it maps to (``Param.original``, ``Method.original``). The table of
``docs/guides/conventions.md`` is :func:`conventions_table`'s output (``tests/methods/test_conventions.py``
checks it), and ``posenc schemes`` prints the same mapping after each parameter (``Param.describe``)."""

from __future__ import annotations

from posenc.methods import METHODS

__all__ = ["conventions", "conventions_table"]


def conventions() -> list[tuple[str, str, str, str]]:
    """``(method, original implementation, posenc parameter, original's parameter)`` for every remap and mask
    method, in registry order."""
    rows = []
    for name, m in METHODS.items():
        if m.kind not in ("remap", "mask"):
            continue
        for p in m.params:
            rows.append((name, m.original or "(paper only)", p.name, p.original or "-"))
    return rows


def conventions_table() -> str:
    """The markdown table of :func:`conventions` (one row per parameter)."""
    lines = ["| method | original | posenc parameter | original's parameter |", "|---|---|---|---|"]
    lines += [f"| `{n}` | {o} | `{p}` | {orig} |" for n, o, p, orig in conventions()]
    return "\n".join(lines)
