"""Whose results a folder holds, and whether a command may write its own there: checked before any work.

``posenc eval``, ``posenc bench`` and ``posenc tune`` write ``results.json`` and a report into ``--out``. What a user
expects of that folder:

- a resumable run (``tune``, a ``bench`` preset) given its own folder again continues where it stopped and then
  rewrites its own ``results.json`` and report: the folder is its own when its ``results.json`` was written by the
  same kind of run of the same thing (the same preset, the same model and length: ``same``; other files beside
  them are left alone, the run writes only its own names), or, without ``results.json``, when it holds nothing but
  what such a run writes (an interrupted run that wrote its cells and no results yet);
- a folder holding another kind of run's results (a suite ``--out`` pointed at a tune folder), another run of the
  same kind (another preset, model or length), or no results but files no such run writes (a model folder), is
  refused, nothing written: what it holds is not this run's to replace;
- ``eval`` is not resumable: its ``--out`` is a new or empty folder (:func:`posenc.runtime.folders.check_target`);
- an ``--out`` that is a file is refused (before any work: the error is not found after the whole table was
  computed).

Every refusal is one ``ValueError`` line naming the flag (``what``) and the folder. A ``results.json`` written
before ``meta["kind"]`` existed is recognised by its fields (:func:`results_kind`).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["OWN", "check_results_folder", "results_kind"]

# What each kind of run writes into its folder (besides results.json and the dot files: the lock, temp files);
# a name ending in "*" is a pattern (fnmatch)
OWN = {"tune": ("cells", "report.md", "model", "rope.gguf"),
       "suite": ("cells", "report.md", "report.html", "*.png"),
       "lab bench": ("cells", "runs", "report.md", "report.html", "*.png")}

_SHOWN = {"tune": "posenc tune", "suite": "posenc bench (real-model preset)", "lab bench": "posenc bench (lab preset)",
          "eval": "posenc eval"}


def results_kind(meta: dict) -> str | None:
    """The kind of run (``"tune"``, ``"suite"``, ``"lab bench"``, ``"eval"``) whose ``results.json`` has this
    ``meta``; None when it is none of posenc's."""
    if not isinstance(meta, dict):
        return None
    if meta.get("kind") in _SHOWN:
        return meta["kind"]
    if meta.get("command") == "posenc eval":
        return "eval"
    if "budget_forwards" in meta:
        return "tune"
    if "preset" in meta and "model_id" in meta:
        return "suite"
    if "preset" in meta and "runs_dir" in meta:
        return "lab bench"
    return None


def _describe(kind: str | None, meta: dict) -> str:
    if kind is None:
        return "results posenc did not write"
    bits = [f"{k} {meta[k]!r}" for k in ("preset", "model", "length") if k in meta and meta[k] is not None]
    return f"the results of {_SHOWN[kind]}" + (f" ({', '.join(bits)})" if bits else "")


def _own(name: str, kind: str) -> bool:
    from fnmatch import fnmatch

    return name.startswith(".") or name == "results.json" or any(fnmatch(name, pat) for pat in OWN[kind])


def check_results_folder(folder, kind: str, *, what: str = "--out", same: dict | None = None) -> None:
    """``ValueError`` (one line naming ``what`` and ``folder``) unless a run of ``kind`` may write its results into
    ``folder`` (module docstring). ``same``: the fields of ``results.json``'s ``meta`` that must equal this run's
    (``{"preset": "smollm2"}``, ``{"model_id": ..., "length": 512}``) for the folder to be its own; a field the
    stored meta lacks is not compared. ``kind`` ``"eval"``: a new or empty folder."""
    from posenc.runtime.folders import check_target

    folder = Path(folder)
    if kind == "eval":
        check_target(folder, what=what)
        return
    if kind not in OWN:
        raise ValueError(f"kind must be one of {sorted(OWN) + ['eval']}, got {kind!r}")
    check_target(folder, what=what, replace=True)  # a file: refused
    if not folder.is_dir():
        return
    new = "give a new or empty folder (nothing was written)"
    results = folder / "results.json"
    if results.exists():
        try:
            meta = json.loads(results.read_text(encoding="utf-8")).get("meta")
        except (OSError, ValueError, AttributeError):
            raise ValueError(f"{what} {str(folder)!r} holds a results.json that is not posenc's results (it does "
                             f"not parse as them): {new}") from None
        got = results_kind(meta)
        if got != kind:
            raise ValueError(f"{what} {str(folder)!r} holds {_describe(got, meta or {})}, which this "
                             f"{_SHOWN[kind]} would replace: {new}")
        differ = [k for k, v in (same or {}).items() if k in meta and meta[k] != v]
        if differ:
            was = ", ".join(f"{k} {meta[k]!r}" for k in differ)
            now = ", ".join(f"{k} {same[k]!r}" for k in differ)
            raise ValueError(f"{what} {str(folder)!r} holds the results of another {_SHOWN[kind]} run ({was}; this "
                             f"one: {now}), which this run would replace: re-run that one to resume it, or {new}")
        return  # its own folder: files beside its results (notes, another tool's output) are left alone
    foreign = sorted(p.name for p in folder.iterdir() if not _own(p.name, kind))
    if foreign:
        shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
        raise ValueError(f"{what} {str(folder)!r} holds files that {_SHOWN[kind]} does not write ({shown}): {new}, "
                         f"or the folder of an earlier {_SHOWN[kind]} run to resume it")
