"""The long-context suite's named presets, built from the data file ``presets.json`` beside this module: its
contexts by name, the parameters ``posenc tune`` found (``tuned``: kept equal to the committed tune results by
``tests/repo/test_committed_results.py``), and each preset's lengths, rows, contexts and fixed parameters. A preset's
``dynamic_step`` gives every dynamic schedule of the registry (:attr:`posenc.methods.Method.dynamic`) that
``step``; a row's ``{"tuned": NAME, ...}`` is that tuned parameter set with its other keys added. What each preset
measured and how long it took: ``docs/results/smollm2.md``."""

from __future__ import annotations

import json
from pathlib import Path

from posenc.evals.suite.spec import ContextSpec, SuitePreset

__all__ = ["SUITE_PRESETS", "load_presets"]

DATA = Path(__file__).with_name("presets.json")


def _params(preset: dict, tuned: dict) -> dict:
    """A preset's fixed parameters per row label, with ``dynamic_step`` and ``tuned`` references resolved."""
    from posenc.methods import METHODS

    out: dict = {}
    if "dynamic_step" in preset:
        out.update({m.name: {"step": preset["dynamic_step"]} for m in METHODS.values()
                    if m.dynamic and m.param("step") is not None})
    for label, value in preset.get("params", {}).items():
        value = dict(value)
        name = value.pop("tuned", None)
        out[label] = {**tuned[name], **value} if name is not None else value
    return out


def load_presets(path=DATA) -> dict[str, SuitePreset]:
    """Every preset of the data file ``path``, by name."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    contexts = {name: ContextSpec(**{**spec, "generators": tuple(spec["generators"]),
                                     **({"methods": tuple(spec["methods"])} if "methods" in spec else {})})
                for name, spec in data["contexts"].items()}
    out = {}
    for p in data["presets"]:
        fields = {k: v for k, v in p.items() if k not in ("contexts", "params", "dynamic_step")}
        for key in ("lengths", "methods", "compare_to", "length_factors", "retrieval_kinds"):
            if key in fields:
                fields[key] = tuple(fields[key])
        out[p["name"]] = SuitePreset(**fields, contexts=tuple(contexts[c] for c in p["contexts"]),
                                     params=_params(p, data["tuned"]))
    return out


SUITE_PRESETS: dict[str, SuitePreset] = load_presets()
