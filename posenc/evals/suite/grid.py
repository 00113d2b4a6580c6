"""The long-context suite as a grid of resumable cells: every method x length x context x seed on one model.

A :class:`SuitePreset` names the model (a folder, a GGUF file or a bundled model, :mod:`posenc.hf.source`), the
lengths, the methods (the untouched model is always the first row), the contexts (:class:`ContextSpec`: a
haystack and the task generators hidden in it, with a number of seeds) and how effective length is judged.

Each method gets, at each length ``n``, the parameters a user would set to read ``n`` tokens with a model trained
at ``L``: :func:`posenc.methods.length_defaults` from the method's registry record (``factor = n / L``,
SelfExtend's smallest group keeping positions below ``L``, DCA's chunk ``3L/4`` and local window ``L/16``, the
windows at ``L``; documented per method by ``posenc schemes``), plus the preset's fixed ``params``.

:func:`run_suite` runs every cell not yet in ``out/cells`` (:class:`posenc.runtime.cells.CellStore`): a cell is one
prefill of one context answering all its queries (:func:`posenc.evals.suite.prefill.run_context`), stored atomically as
soon as it finishes, so an interrupted run continues where it stopped and a run can be completed over several
sittings. The output folder and the cells folder are locked (:class:`posenc.runtime.lock.FolderLock`, each on
itself: two runs with cells in two folders side by side do not exclude each other) while a run writes them; a report
of the finished cells (``report_only``) writes no cell and locks only the output folder, so it reads a cells folder it
may not write. SIGINT or SIGTERM stops a run at once with one line naming the cells folder (a cell in flight is
computed again on resume, every written one is whole; a damaged one is computed again,
:func:`posenc.evals.suite.runner.cell_is_whole`); a resume first removes the temp files of killed writers.

The output folder is checked before the model is loaded (:func:`posenc.evals.results_folder.check_results_folder`):
new or empty, or the folder of an earlier run of the same preset on the same model (resumed, its results and report
rewritten); a file, another command's results, another preset's or model's, or files the suite does not write are
refused in one line naming ``--out``. At lengths from
``prune_from`` on, a method runs only if its result at the previous length allows (:func:`_pruned`; the note in the
results says which methods were left out and why).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from posenc.evals.suite.spec import ContextSpec, ModelFacts, SuitePreset, load_facts, plan

__all__ = ["ContextSpec", "SuitePreset", "plan", "run_suite"]

def _answers(store, m: ModelFacts, preset: SuitePreset, method: str, length: int) -> list[dict]:
    """Every finished answer of ``method`` at ``length``."""
    from posenc.evals.suite.results import _cells_of

    return [a for _, _, v in _cells_of(store, m, preset, method, length) for a in v["answers"]]


def _retrieval_rate(store, m: ModelFacts, preset: SuitePreset, method: str, length: int) -> float | None:
    """The informative retrieval score (:func:`posenc.evals.suite.results.informative_kinds`) of the finished
    answers of ``method`` at ``length`` (None when none finished)."""
    from posenc.evals.suite.results import informative_kinds, pooled, task_counts

    kinds = informative_kinds(task_counts(_answers(store, m, preset, preset.methods[0], preset.reference_length)))
    got = pooled(task_counts(_answers(store, m, preset, method, length)), kinds)
    return got["value"] if got["n"] else None


def _unfinished(store, m: ModelFacts, preset: SuitePreset, method: str, length: int) -> int:
    """How many cells of ``method`` at ``length`` are not finished."""
    from posenc.evals.suite.results import _cells_of

    planned = sum(len(spec.seed_range) for spec in preset.contexts if spec.used_at(length, method))
    return planned - len(_cells_of(store, m, preset, method, length))


def _fits(preset: SuitePreset, m: ModelFacts) -> None:
    """``ValueError`` in one line when a context of ``preset`` cannot be built at a length it runs at (a model
    trained too short for the suite's needles, or a length past a book haystack's reach): checked on each context's
    shortest and longest length before any cell runs."""
    from posenc.evals.suite.runner import haystack_of
    from posenc.tasks.context import build_context

    for spec in preset.contexts:
        used = [n for n in sorted(preset.lengths) if spec.used_at(n)]
        if not used:
            continue
        for n in dict.fromkeys((used[0], used[-1])):
            try:
                build_context(m.tokenizer, haystack_of(spec.haystack, m.tokenizer), n, spec.generators,
                              spec.first_seed, spec.target, preset.chat, spec.options, spec.reach)
            except ValueError as exc:
                hint = "give longer lengths (--lengths)" if n == used[0] else "give shorter lengths (--lengths)"
                raise ValueError(f"model trained at {m.train_len} tokens: the context {spec.name} does not fit its "
                                 f"length {n} ({exc}); {hint}") from None


def reference_rate(store, m: ModelFacts, preset: SuitePreset) -> dict:
    """The untouched model's retrieval at the reference length over the finished cells: ``k``, ``n``, ``value``
    (None when none finished), pooled over ``preset.retrieval_kinds`` (or the informative kinds)."""
    from posenc.evals.suite.results import informative_kinds, pooled, task_counts

    tasks = task_counts(_answers(store, m, preset, preset.methods[0], preset.reference_length))
    return pooled(tasks, preset.retrieval_kinds or informative_kinds(tasks))


def check_floor(store, m: ModelFacts, preset: SuitePreset, cells) -> None:
    """``ValueError`` in one line when the untouched model's retrieval at the reference length is below
    ``preset.floor``: every verdict would be judged against a reference the model itself does not reach."""
    ref = reference_rate(store, m, preset)
    if preset.floor is not None and ref["n"] and ref["value"] < preset.floor:
        raise ValueError(f"the untouched model finds {ref['k']} of {ref['n']} keys ({ref['value']:.2f}) at its "
                         f"trained length {preset.reference_length}, below the floor {preset.floor:g}: no method "
                         f"can be judged against that reference, so none is (its cells are kept in {cells})")


def _pruned(store, m: ModelFacts, preset: SuitePreset, method: str, length: int, *,
            settled_only: bool = False) -> str | None:
    """Why ``method`` is left out at ``length`` (None: it runs).

    ``settled_only`` (a report of an unfinished run): a reason only once the cells it rests on (``method`` at the
    previous length, the untouched model at the reference length) are all finished; None before, so the pair
    counts as not run yet rather than left out.

    A preset judged by the interval rule (``retrieval_kinds`` set) leaves a row out once its verdict at the previous
    length lost the keys or the perplexity (:func:`_lost_at`), or, with ``prune_unless_extends``, unless it extended
    there (the ``compare_to`` rows always run: the paired intervals at the length are taken against them); the
    others, once its retrieval there fell below ``threshold`` x the untouched model's at the reference length (a
    point estimate)."""
    if preset.prune_from is None or length < preset.prune_from or method == preset.methods[0]:
        return None
    if preset.prune_unless_extends and method in preset.compare_to:
        return None
    shorter = [n for n in sorted(preset.lengths) if n < length]
    if not shorter:
        return None
    prev = shorter[-1]
    if settled_only and (_unfinished(store, m, preset, method, prev)
                         or _unfinished(store, m, preset, preset.methods[0], preset.reference_length)):
        return None
    if preset.retrieval_kinds is not None:  # judged by the interval rule: left out once it lost something
        return _lost_at(store, m, preset, method, prev)
    ref = _retrieval_rate(store, m, preset, preset.methods[0], preset.reference_length)
    rate = _retrieval_rate(store, m, preset, method, prev)
    if ref is None or rate is None:
        return f"its cells at {prev} are not finished"
    if rate < preset.threshold * ref:
        return (f"retrieval {rate:.2f} at {prev} was below {preset.threshold:g} x the untouched model's "
                f"{ref:.2f} at {preset.reference_length}")
    return None


def _lost_at(store, m: ModelFacts, preset: SuitePreset, method: str, length: int) -> str | None:
    """Why ``method`` stops after ``length`` under the interval rule (:mod:`posenc.evals.suite.verdict`): its
    verdict there, from the finished cells, lost the keys or the perplexity (``keeps perplexity only`` or
    ``neither``); None while it extends or is undecided, since a row a few keys short of the reference is not
    yet shown to fail. With ``preset.prune_unless_extends`` an undecided verdict stops it too (a preset that spends
    its longest length only on the rows shown to extend at the one before)."""
    from posenc.evals.suite.results import _cells_of, passage_losses, pooled, ppl_ratio, task_counts
    from posenc.evals.suite.verdict import EXTENDS, UNDECIDED, at_length, ppl_status, retrieval_status

    ref_cells = _cells_of(store, m, preset, preset.methods[0], preset.reference_length)
    cells = _cells_of(store, m, preset, method, length)
    if not ref_cells or not cells:
        return f"its cells at {length} are not finished"

    def keys(c):
        return pooled(task_counts([a for _, _, v in c for a in v["answers"]]), preset.retrieval_kinds)

    row, ref = keys(cells), keys(ref_cells)
    ratio = ppl_ratio(passage_losses(cells), passage_losses(ref_cells))
    verdict = at_length(retrieval_status(row, ref), ppl_status(ratio, preset.ppl_bound))
    if verdict == EXTENDS or (verdict == UNDECIDED and not preset.prune_unless_extends):
        return None
    ppl = (f", perplexity {ratio['value']:.2f}x the untouched model's at {preset.reference_length}"
           if ratio is not None else "")
    return (f"{verdict} at {length} (keys {row['k']}/{row['n']}, the untouched model's {ref['k']}/{ref['n']} at "
            f"{preset.reference_length}{ppl})")


def _machine(device="cpu") -> dict:
    import torch

    gpu = {"gpu": torch.cuda.get_device_name(device)} if torch.device(device).type == "cuda" else {}
    return {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "processor": _cpu_model(), "threads": torch.get_num_threads(), **gpu}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run_suite(preset: SuitePreset, out_dir, *, cells_dir=None, progress: bool = True,
              log: Callable[[str], None] = print, report_only: bool = False, device="cpu", dtype="auto",
              dispatch: str | None = None, ray_address: str | None = None, lengths=None) -> dict:
    """Run every unfinished cell of ``preset`` into ``out_dir/cells`` (module docstring), then write
    ``results.json`` and the report (:mod:`posenc.evals.suite.results`). Returns the results dict.

    ``device``/``dtype``: what every model of the run is loaded on and with (``"auto"``: float32 on the CPU,
    bfloat16 on CUDA); a cell's key names them unless they are the CPU and float32
    (:func:`posenc.evals.suite.spec.runs_on`), and ``results.json``'s meta records them.

    ``report_only``: run no cell (and no calibration); write the results and the report of the cells finished so
    far, with ``meta["missing"]`` (``{"method@length": unfinished cells}``) and ``meta["complete"]`` saying what is
    not run yet: the state of a run completed over several sittings.

    ``cells_dir``: keep the cells there instead, e.g. another run's ``cells`` folder. A cell's key names everything
    its result depends on (model, method, parameters, length, context, seed, suite version), not the preset, so a
    preset that shares cells with a larger one reads the cells that one finished and adds its own there; the folder
    ``cells_dir`` is locked as well, so two runs cannot write it at once.

    ``dispatch``: None runs the cells here, one after the other; ``"ray"`` runs each as a task on a Ray cluster
    (:mod:`posenc.evals.suite.cluster`: ``ray_address`` None starts a local one, ``"auto"`` or an address joins one),
    with the same cells, the same left-out pairs and the same results but for timing and machine fields.

    A preset derived from the model (``length_factors``, :meth:`posenc.evals.suite.spec.SuitePreset.sized`) takes its
    lengths, reference length, key bins and target sizes from the model's trained length ``L``; ``lengths``
    overrides the lengths (``L`` is kept: it is the reference). Every context must fit its shortest length (one
    line otherwise). With a ``floor``, the untouched model's cells at ``L`` run first, and the run stops with one
    line when its retrieval there is below the floor (:func:`check_floor`)."""
    from contextlib import ExitStack

    from posenc.evals.results_folder import check_results_folder
    from posenc.evals.suite.results import write_results
    from posenc.evals.suite.runner import cell_is_whole, run_cells
    from posenc.runtime.cells import CellStore
    from posenc.runtime.interrupt import StopSignals
    from posenc.runtime.lock import FolderLock

    if dispatch not in (None, "ray"):
        raise ValueError(f"dispatch must be None (run the cells here) or 'ray', got {dispatch!r}")
    if dispatch and report_only:
        raise ValueError("dispatch='ray' runs cells and report_only runs none: pass one of them")
    if dispatch:
        from posenc.evals.suite.cluster import require_ray

        require_ray()
    out = Path(out_dir)
    cells = out / "cells" if cells_dir is None else Path(cells_dir)
    check_results_folder(out, "suite")  # a file, another command's results: refused before the model is loaded
    m = load_facts(preset.model, device, dtype)
    from posenc.evals.suite.runner import new_run

    new_run()  # this run's tokenizer: haystacks are tokenized once, for the checks and the cells
    if preset.derived or lengths is not None:
        preset = preset.sized(m.train_len, lengths)
    _fits(preset, m)
    same = {"preset": preset.name, "model_id": m.model_id}
    check_results_folder(out, "suite", same=same)
    with ExitStack() as stack:
        stack.enter_context(FolderLock(out, what="suite run", tidy=True))
        if not report_only:  # a report reads the cells: no lock on them (a read-only cells folder works)
            stack.enter_context(FolderLock(cells, what="suite cells", tidy=True))
        stack.enter_context(StopSignals(now=lambda sig: f"interrupted by {sig}: the finished cells are kept in "
                                                        f"{cells}; run the same command to continue from them"))
        check_results_folder(out, "suite", same=same)  # now that it is ours
        store = CellStore(cells, check=cell_is_whole)
        if not report_only:
            store.remove_stale_temps()  # of writers killed in an earlier run: no other writer while locked
        import torch

        old = torch.get_num_threads()
        if preset.threads:
            torch.set_num_threads(preset.threads)
        try:
            from posenc.evals.suite.calibration import resolve

            t0 = time.perf_counter()
            preset = resolve(preset, m, store, log, compute=not report_only)
            missing: dict[str, int] | None = {} if report_only else None
            pruned = partial(_pruned, settled_only=True) if report_only else _pruned
            ray: dict = {}  # {"ray": what the cluster was} for meta.machine
            if dispatch == "ray":
                from posenc.evals.suite.cluster import run_cells_ray

                ray["ray"] = {}

                def cells_of(p, missing=None):  # what was not run is read from the cells afterwards
                    return run_cells_ray(p, m, store, log=log, pruned=pruned, address=ray_address,
                                         cluster=ray["ray"])
            else:
                def cells_of(p, missing=None):
                    return run_cells(p, m, store, progress=progress and not report_only, log=log, pruned=pruned,
                                     missing=missing)
            if preset.floor is not None and not report_only:  # the reference first: is there one to judge by?
                cells_of(preset.only(preset.methods[:1], (preset.reference_length,)))
                check_floor(store, m, preset, cells)
            skipped = cells_of(preset, missing)
            elapsed = time.perf_counter() - t0
            if report_only and not skipped and sum(missing.values()) == len(plan(preset)):
                raise ValueError(f"--report-only: no cell of {preset.name!r} is finished in {cells}; run it without "
                                 "--report-only first, or name a folder that holds its cells with --cells")
            return write_results(preset, m, store, out, skipped=skipped, machine=_machine(m.device) | ray,
                                 run_seconds=elapsed, missing=missing or {})
        finally:
            torch.set_num_threads(old)
