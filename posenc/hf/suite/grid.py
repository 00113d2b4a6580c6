"""The long-context suite as a grid of resumable cells: every method x length x context x seed on one model.

A :class:`SuitePreset` names the model (a folder, a GGUF file or a bundled model, :mod:`posenc.hf.source`), the
lengths, the methods (the untouched model is always the first row), the contexts (:class:`ContextSpec`: a
haystack and the task generators hidden in it, with a number of seeds) and how effective length is judged.

Each method gets, at each length ``n``, the parameters a user would set to read ``n`` tokens with a model trained
at ``L``: :func:`posenc.lab.evaluate.length_defaults` from the method's registry record (``factor = n / L``,
SelfExtend's smallest group keeping positions below ``L``, DCA's chunk ``3L/4`` and local window ``L/16``, the
windows at ``L``; documented per method by ``posenc schemes``), plus the preset's fixed ``params``.

:func:`run_suite` runs every cell not yet in ``out/cells`` (:class:`posenc.lab.cells.CellStore`): a cell is one
prefill of one context answering all its queries (:func:`posenc.hf.suite.run.run_context`), stored atomically as
soon as it finishes, so an interrupted run continues where it stopped and a run can be completed over several
sittings. The output folder is locked (:class:`posenc.lab.lock.FolderLock`) while a run writes it. At lengths from
``prune_from`` on, a method runs only if its retrieval at the previous length reached the threshold (the note in
the results says which methods were left out and why).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["ContextSpec", "SUITE_VERSION", "SuitePreset", "cell_key", "method_params", "method_spec", "plan",
           "run_suite"]

SUITE_VERSION = 1
"""Bumped when anything that changes a cell's result changes (tasks, layout, scoring): part of every cell key."""


@dataclass(frozen=True)
class ContextSpec:
    """One kind of context: ``haystack`` (``book`` or ``noise``) holding the needles of ``generators``; ``seeds``
    contexts of it per (method, length), seeds ``first_seed`` .. ``first_seed + seeds - 1``; ``target`` scored tokens
    at the end (book haystacks; 0: none); ``max_length``: used only up to this length (None: every length);
    ``options``: keyword parameters per generator (``{"niah": {"n_keys": 4}}``)."""

    haystack: str
    generators: tuple[str, ...]
    seeds: int = 1
    target: int = 0
    max_length: int | None = None
    options: dict = field(default_factory=dict)
    first_seed: int = 0

    @property
    def seed_range(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)

    @property
    def name(self) -> str:
        return f"{self.haystack}:{'+'.join(self.generators)}"


@dataclass(frozen=True)
class SuitePreset:
    """Everything a suite run depends on (module docstring). ``reference_length``: the untouched model's
    retrieval there is the reference; ``threshold``: the fraction of it a method must keep for a length to count
    as effective; ``params``: fixed parameters per method spec, on top of the per-length ones."""

    name: str
    description: str
    model: str = "smollm2"
    lengths: tuple[int, ...] = (4096, 8192, 16384)
    methods: tuple[str, ...] = ("none",)
    contexts: tuple[ContextSpec, ...] = ()
    reference_length: int = 4096
    threshold: float = 0.85
    prune_from: int | None = None
    params: dict = field(default_factory=dict)
    chat: bool = False
    threads: int | None = None

    def __post_init__(self):
        from posenc.scheme.methods import is_identity

        if not self.methods or not is_identity(self.methods[0]):
            raise ValueError(f"a suite's first method must be 'none' (the untouched model), got {self.methods[:1]}")
        if self.reference_length not in self.lengths:
            raise ValueError(f"reference_length {self.reference_length} must be one of the lengths {self.lengths}")
        if not self.contexts:
            raise ValueError("a suite needs at least one context")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    def to_dict(self) -> dict:
        return asdict(self)


def method_spec(label: str) -> str:
    """The method spec of a row label: ``"dca@qwen"`` is ``dca`` with the fixed parameters the preset gives the
    label ``dca@qwen`` (two rows of one method with different parameters); a label without ``@`` is the spec."""
    return label.split("@", 1)[0]


def method_params(method: str, train_len: int, length: int, head_dim: int, base: float, fixed: dict) -> dict:
    """The parameters row ``method`` (a label, :func:`method_spec`) runs with at ``length``: the per-length
    defaults of its spec, then the preset's fixed ones for the label."""
    from posenc.lab.evaluate import length_defaults
    from posenc.scheme.methods import is_identity

    spec = method_spec(method)
    if is_identity(spec):
        return {}
    return {**length_defaults(spec, train_len, length, head_dim=head_dim, base=base), **fixed.get(method, {})}


def cell_key(model_id: str, method: str, params: dict, length: int, spec: ContextSpec, seed: int, chat: bool) -> dict:
    """Everything a cell's result depends on (:class:`posenc.lab.cells.CellStore` key)."""
    return {"suite": SUITE_VERSION, "model": model_id, "method": method, "params": params, "length": length,
            "haystack": spec.haystack, "generators": list(spec.generators), "target": spec.target, "seed": seed,
            "chat": chat, **({"options": spec.options} if spec.options else {})}


def plan(preset: SuitePreset) -> list[tuple[int, str, ContextSpec, int]]:
    """Every cell ``(length, method, context, seed)`` the preset may run, shortest length first."""
    return [(n, m, spec, s) for n in sorted(preset.lengths) for m in preset.methods for spec in preset.contexts
            if spec.max_length is None or n <= spec.max_length for s in spec.seed_range]


@dataclass
class _Model:
    """The untouched model's folder, tokenizer and shape facts, loaded once per run."""

    folder: Path
    tokenizer: object
    model_id: str
    train_len: int
    head_dim: int
    base: float

    def fresh(self, method: str, params: dict):
        """A fresh copy of the model (float32, eval) extended with row ``method`` (a label)."""
        import torch

        from posenc.hf.patch import extend, load

        model = load(self.folder, dtype=torch.float32)
        return extend(model, method_spec(method), **params)  # "none": the model as it is


def _load(source) -> _Model:
    from transformers import AutoConfig

    from posenc.hf.patch import scheme_from_config, train_len_of
    from posenc.hf.source import load_tokenizer, source_folder

    folder = source_folder(source)
    cfg = AutoConfig.from_pretrained(folder)
    rope = scheme_from_config(cfg).rope
    if rope is None:
        raise ValueError(f"model {source!r} has no RoPE: the suite's methods extend RoPE models")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    model_id = f"{Path(folder).name}:{cfg.model_type}"  # the folder name holds the GGUF's digest when converted
    return _Model(folder, load_tokenizer(source), model_id, train_len_of(cfg), int(head_dim), float(rope.base))


def _retrieval_rate(store, m: _Model, preset: SuitePreset, method: str, length: int) -> float | None:
    """Mean exact-match rate over every finished query of ``method`` at ``length`` (None when none finished)."""
    hits = []
    params = method_params(method, m.train_len, length, m.head_dim, m.base, preset.params)
    for spec in preset.contexts:
        for s in spec.seed_range:
            v = store.get(cell_key(m.model_id, method, params, length, spec, s, preset.chat))
            if v is not None:
                hits += [a["correct"] for a in v["answers"]]
    return sum(hits) / len(hits) if hits else None


def _pruned(store, m: _Model, preset: SuitePreset, method: str, length: int) -> str | None:
    """Why ``method`` is left out at ``length`` (None: it runs)."""
    if preset.prune_from is None or length < preset.prune_from or method == preset.methods[0]:
        return None
    shorter = [n for n in sorted(preset.lengths) if n < length]
    if not shorter:
        return None
    prev = shorter[-1]
    ref = _retrieval_rate(store, m, preset, preset.methods[0], preset.reference_length)
    rate = _retrieval_rate(store, m, preset, method, prev)
    if ref is None or rate is None:
        return f"its cells at {prev} are not finished"
    if rate < preset.threshold * ref:
        return (f"retrieval {rate:.2f} at {prev} was below {preset.threshold:g} x the untouched model's "
                f"{ref:.2f} at {preset.reference_length}")
    return None


def _machine() -> dict:
    import torch

    return {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "processor": _cpu_model(), "threads": torch.get_num_threads()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run_suite(preset: SuitePreset, out_dir, *, progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run every unfinished cell of ``preset`` into ``out_dir/cells`` (module docstring), then write
    ``results.json`` and the report (:mod:`posenc.hf.suite.results`). Returns the results dict."""
    from posenc.hf.suite.cells import run_cells
    from posenc.hf.suite.results import write_results
    from posenc.lab.cells import CellStore
    from posenc.lab.lock import FolderLock

    out = Path(out_dir)
    with FolderLock(out, what="suite run"):
        import torch

        old = torch.get_num_threads()
        if preset.threads:
            torch.set_num_threads(preset.threads)
        try:
            from posenc.hf.suite.calibration import resolve

            m = _load(preset.model)
            store = CellStore(out / "cells")
            t0 = time.perf_counter()
            preset = resolve(preset, m, store, log)
            skipped = run_cells(preset, m, store, progress=progress, log=log, pruned=_pruned)
            elapsed = time.perf_counter() - t0
            return write_results(preset, m, store, out, skipped=skipped, machine=_machine(), run_seconds=elapsed)
        finally:
            torch.set_num_threads(old)
