"""Import paths of the modules that moved when the package was reorganized into floors (runtime, data, tasks,
methods, training, evals): importing an old path still works for one more release and says, in one
``FutureWarning``, where the module lives now. The old name is the same module object as the new one.

The table is the record of the move; nothing in posenc imports an old path (``tests/repo/test_layers.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings

MOVED: dict[str, str] = {
    "posenc._atomic": "posenc.runtime.atomic",
    "posenc.engine.calibrate": "posenc.evals.calibrate",
    "posenc.hf.evaluate": "posenc.evals.pretrained",
    "posenc.hf.suite": "posenc.evals.suite",
    "posenc.hf.suite.calibration": "posenc.evals.suite.calibration",
    "posenc.hf.suite.cells": "posenc.evals.suite.runner",
    "posenc.hf.suite.cluster": "posenc.evals.suite.cluster",
    "posenc.hf.suite.context": "posenc.tasks.context",
    "posenc.hf.suite.grid": "posenc.evals.suite.grid",
    "posenc.hf.suite.haystack": "posenc.tasks.haystack",
    "posenc.hf.suite.presets": "posenc.evals.suite.presets",
    "posenc.hf.suite.report": "posenc.evals.report.suite",
    "posenc.hf.suite.results": "posenc.evals.suite.results",
    "posenc.hf.suite.run": "posenc.evals.suite.prefill",
    "posenc.hf.suite.score": "posenc.tasks.score",
    "posenc.hf.suite.spec": "posenc.evals.suite.spec",
    "posenc.hf.suite.tasks": "posenc.tasks.ruler",
    "posenc.hf.suite.words": "posenc.tasks.words",
    "posenc.lab": "posenc.evals.lab",
    "posenc.lab.atomic": "posenc.runtime.atomic",
    "posenc.lab.batches": "posenc.data.batches",
    "posenc.lab.bench": "posenc.evals.lab.bench",
    "posenc.lab.bench_cells": "posenc.evals.lab.resume",
    "posenc.lab.bench_presets": "posenc.evals.lab.presets",
    "posenc.lab.bench_probes": "posenc.evals.lab.probes",
    "posenc.lab.bench_train": "posenc.evals.lab.training",
    "posenc.lab.cells": "posenc.runtime.cells",
    "posenc.lab.checkpoint": "posenc.models.checkpoint",
    "posenc.lab.corpora": "posenc.data.corpora",
    "posenc.lab.corpus_install": "posenc.data.corpus_install",
    "posenc.lab.data": "posenc.data.prepare",
    "posenc.lab.evaluate": "posenc.evals.lab.evaluate",
    "posenc.lab.families": "posenc.evals.report.families",
    "posenc.lab.interrupt": "posenc.runtime.interrupt",
    "posenc.lab.kv_recall": "posenc.tasks.kv_recall",
    "posenc.lab.lock": "posenc.runtime.lock",
    "posenc.lab.metrics": "posenc.evals.lab.metrics",
    "posenc.lab.parallel": "posenc.runtime.parallel",
    "posenc.lab.pooling": "posenc.evals.stats.pooling",
    "posenc.lab.positions": "posenc.training.positions",
    "posenc.lab.recall": "posenc.tasks.recall",
    "posenc.lab.records": "posenc.evals.records",
    "posenc.lab.report": "posenc.evals.report.lab",
    "posenc.lab.report_doc": "posenc.evals.report.doc",
    "posenc.lab.report_eval": "posenc.evals.report.evaluation",
    "posenc.lab.report_headline": "posenc.evals.report.headline",
    "posenc.lab.report_retrieval": "posenc.evals.report.retrieval",
    "posenc.lab.s2": "posenc.training.s2",
    "posenc.lab.stats": "posenc.evals.stats.intervals",
    "posenc.lab.tasks": "posenc.tasks.passkey",
    "posenc.lab.tokenizer": "posenc.data.tokenizer",
    "posenc.lab.train": "posenc.training.train",
    "posenc.lab.verdict": "posenc.evals.stats.verdict",
    "posenc.scheme.conventions": "posenc.methods.conventions",
    "posenc.scheme.methods": "posenc.methods.registry",
    "posenc.scheme.records": "posenc.methods.records",
    "posenc.tune": "posenc.evals.tune",
    "posenc.tune.factors": "posenc.evals.tune.factors",
    "posenc.tune.gguf_rope": "posenc.evals.tune.gguf_rope",
    "posenc.tune.objective": "posenc.evals.tune.objective",
    "posenc.tune.search": "posenc.evals.tune.search",
}


#: old packages whose modules went to several new homes: importing one gives a package that finds each old
#: module at its new path (``from posenc.lab import checkpoint``) and anything else in the package named here
PACKAGES = {"posenc.lab": "posenc.evals.lab", "posenc.hf.suite": "posenc.evals.suite",
            "posenc.tune": "posenc.evals.tune"}


def _old_package(old: str, new: str) -> types.ModuleType:
    module = types.ModuleType(old, f"moved: its modules are in {new} and the packages of posenc._moved.MOVED")
    module.__path__ = []

    def __getattr__(name):
        if f"{old}.{name}" in MOVED:
            return importlib.import_module(f"{old}.{name}")
        return getattr(importlib.import_module(new), name)

    module.__getattr__ = __getattr__
    return module


class _Alias:
    """Loads an old path as the module at its new path (an importlib loader: ``create_module`` and ``exec_module``;
    not derived from ``importlib.abc``, whose import would slow down every ``import posenc``)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}; the old import path goes in the next release",
                      FutureWarning, stacklevel=2)
        if spec.name in PACKAGES:
            return _old_package(spec.name, self.new)
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:  # the new module is already executed
        return None


class _MovedFinder:
    """Finds the old paths of :data:`MOVED` (and nothing else): a meta path finder (``find_spec``)."""

    def find_spec(self, name, path=None, target=None):
        new = MOVED.get(name)
        if new is None:
            return None
        return importlib.util.spec_from_loader(name, _Alias(new), is_package=True)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (``posenc/__init__.py`` calls it)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
