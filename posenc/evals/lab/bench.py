"""The extrapolation lab: train short, test long, under identical conditions (``posenc bench``).

A :class:`BenchPreset` is plain data: corpus, model size, train length ``L``, steps, batch, eval lengths
(multiples of ``L``), the trained-in schemes, the inference-time methods applied to the RoPE model (and
Su's hierarchical extension of the learned table), a passkey grid, the eval window cap and optional
fine-tune rows (PI / RoPE-base change continued from the RoPE checkpoint at ``2L``).

:func:`run_bench` trains each scheme into ``runs_dir/<scheme>`` (a finished checkpoint is reused, so a
second run only evaluates; an unfinished one resumes from its last checkpoint, saved every tenth of the
steps and on SIGINT/SIGTERM), evaluates every model at every length on the test split
(:func:`posenc.evals.lab.evaluate.evaluate_model`), writes ``results.json`` = ``{"meta": {...}, "records": [...]}``
and the report (``report.md``, ``report.html``, PNGs; :mod:`posenc.evals.report.lab`; every file written
atomically), and prints the Markdown table. Each (model, length, probe) evaluation is a cell kept in
``out_dir/cells/`` (:class:`posenc.runtime.cells.CellStore`), so an interrupted bench (Ctrl-C or SIGTERM: it
stops after the current step or cell, saves, and says so in one line) continues where it stopped. One bench
writes ``out_dir`` at a time (:class:`posenc.runtime.lock.FolderLock`). The protocol is the one of ALiBi
(arXiv:2108.12409, Table 2: non-overlapping windows, every position counts) with Su's next-token accuracy
next to perplexity (ReRoPE post, kexue.fm/archives/9708).

Command line (:mod:`posenc.cli.bench`):
``posenc bench --preset quick --out DIR [--corpus NAME] [--device cpu] [--runs-dir DIR]``.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import replace
from pathlib import Path

from posenc._util import check_device, check_positive_int
from posenc.evals.lab.presets import (  # noqa: F401 - re-exported: the presets live there
    ALL_TRAINED,
    PRESETS,
    ROPE_METHODS,
    BenchPreset,
    FineTune,
    scheme_spec,
    yarn_schedule,
)
from posenc.evals.lab.probes import content_copy_records, passkey_cells, passkey_records, retrieval_records
from posenc.evals.lab.resume import BenchCells
from posenc.evals.lab.training import (  # noqa: F401 - re-exported: the bench's training API
    _finetune_all,
    _run_dir,
    _seed_runs,
    _train,
    _train_all,
    _train_config,
    finetune_seeds,
)
from posenc.evals.records import EvalRecord, RetrievalRecord
from posenc.evals.report.lab import markdown_tables, shape_checks, write_report
from posenc.evals.report.retrieval import ppl_vs_retrieval_table, retrieval_checks
from posenc.methods import NONE, is_identity
from posenc.runtime.atomic import atomic_write_json, remove_stale_temps
from posenc.runtime.interrupt import StopSignals
from posenc.runtime.lock import FolderLock

__all__ = ["BenchPreset", "FineTune", "PRESETS", "ROPE_METHODS", "run_bench", "scheme_spec", "yarn_schedule"]

# ------------------------------------------------------------------------------------------------ helpers
class _Log:
    """One line per stage with the elapsed wall time since the bench started."""

    def __init__(self, enabled: bool):
        self.t0 = time.perf_counter()
        self.enabled = enabled

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str) -> None:
        if self.enabled:
            print(f"[bench {self.elapsed():7.1f}s] {msg}", flush=True)


def _evaluate(model, tokens, preset: BenchPreset, methods, log, lengths=None) -> list[dict]:
    """``evaluate_model`` one length at a time (one progress line each; no record is computed twice);
    ``lengths``: those of ``preset.eval_lengths`` to run (default: all)."""
    from posenc.evals.lab.evaluate import evaluate_model

    records = []
    for n in preset.eval_lengths if lengths is None else lengths:
        t = time.perf_counter()
        records += evaluate_model(model, tokens, [n], [m for m in methods if not is_identity(m)],
                                  mode=preset.eval_mode, max_windows=preset.max_windows,
                                  batch_size=preset.eval_batch_size,
                                  passkey=False, progress=False, **preset.eval_kwargs)
        log(f"  eval_len {n}: {len(methods)} method(s) in {time.perf_counter() - t:.1f}s")
    return records


def _machine(device: str) -> dict:
    import torch

    return {"cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "device": device, "threads": torch.get_num_threads(),
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def _bench_record(rec: EvalRecord, name: str, finetuned: bool, pk: dict, seed: int) -> EvalRecord:
    """``rec`` under the bench's model ``name`` (trained with ``seed``, ``extra["seed"]``), with its passkey
    cells from ``pk`` (or None)."""
    note = "; ".join(x for x in (rec.note, "fine-tuned from the rope checkpoint") if x) if finetuned else rec.note
    cells = pk.get((rec.method, rec.eval_len))
    passkey = {"accuracy": sum(c["accuracy"] for c in cells) / len(cells), "cells": cells} if cells else None
    return rec.replace(scheme=name, note=note, passkey=passkey, extra={**rec.extra, "seed": seed})


def _clean(records: list[EvalRecord]) -> list[dict]:
    """The JSON rows, every :data:`posenc.evals.records.REQUIRED_KEYS` present."""
    return [r.to_dict() for r in records]


# ------------------------------------------------------------------------------------------------ run
def run_bench(preset: BenchPreset | str, out_dir, progress: bool = True, *, corpus: str | None = None,
              device: str = "cpu", runs_dir=None, threads: int | None = None) -> dict:
    """Train (or reuse) every scheme of ``preset``, evaluate, and write results + report into ``out_dir``.

    Checkpoints go to ``runs_dir`` (default ``out_dir/runs``) as ``<scheme>/`` folders; a finished one is
    reused. ``threads`` (default: the preset's) sets ``torch.set_num_threads`` for the run and is restored
    after. Returns the results dict (also in ``out_dir/results.json``) with ``meta`` (preset, corpus,
    machine, timings in seconds, config) and ``records`` (see :mod:`posenc.evals.report.lab`)."""
    import torch

    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
        preset = PRESETS[preset]
    if corpus is not None:
        preset = replace(preset, corpus=corpus)
    check_device("device", device)
    if threads is not None:
        check_positive_int("threads", threads)
    threads = threads if threads is not None else preset.threads
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with FolderLock(out_dir, what="bench", tidy=True), StopSignals() as stop:  # one bench per folder; Ctrl-C saves
            return _run(preset, Path(out_dir), progress, device, runs_dir, stop)
    finally:
        torch.set_num_threads(old_threads)


def _ppl_cell(load, tokens, preset: BenchPreset, methods, log, n: int) -> list[dict]:
    return _evaluate(load(), tokens, preset, methods, log, lengths=[n])


def _passkey_cell(load, preset: BenchPreset, methods, tokenizer) -> list[list]:
    return [[m, n, cells] for (m, n), cells in passkey_cells(load(), preset, methods, tokenizer).items()]


def _recall_cell(load, preset: BenchPreset, methods, tokens, name: str, log, n: int, seed: int = 0) -> list[dict]:
    return [r.to_dict() for r in retrieval_records(load(), preset, methods, tokens, name, log, [n], seed)]


def _models(preset: BenchPreset, run_dirs: dict[str, Path], ft_dirs: dict[str, Path], seed_runs=(),
            ft_seeds=()) -> list[tuple]:
    """Every evaluated model: ``(name, training seed, run_dir, methods)``, the trained schemes with their
    methods, their extra seeds, then the fine-tunes as they are, then their extra seeds."""
    models = [(scheme, preset.seed, run_dir, [NONE.name, *preset.methods_for(scheme)])
              for scheme, run_dir in run_dirs.items()]
    models += [(scheme, seed, run_dir, [NONE.name, *preset.methods_for(scheme)]) for scheme, seed, run_dir in seed_runs]
    models += [(name, preset.seed, run_dir, [NONE.name]) for name, run_dir in ft_dirs.items()]
    models += [(name, seed, run_dir, [NONE.name]) for name, seed, run_dir in ft_seeds]
    return models


def _eval_model(preset: BenchPreset, data, cells, name: str, seed: int, run_dir: Path, methods, log,
                timings) -> tuple[list[dict], dict, list[RetrievalRecord]]:
    """One model's cells (perplexity at every length, passkey, recall): ``(perplexity rows, passkey cells,
    retrieval records)``, each cell read back from ``cells`` when an earlier run (or a worker) finished it."""
    t = time.perf_counter()
    label = name if seed == preset.seed else f"{name}/seed{seed}"
    log(f"eval {label}: {len(methods)} method(s) x {len(preset.eval_lengths)} lengths")
    model = cells.model(name, run_dir, methods)  # loaded on first use
    recs = []
    for n in preset.eval_lengths:
        recs += cells.get("ppl", n, _ppl_cell, model, data.test, preset, methods, log, n)
    timings[f"eval/{label}"] = time.perf_counter() - t
    t = time.perf_counter()
    pk_rows = cells.get("passkey", None, _passkey_cell, model, preset, methods, data.tokenizer) \
        if preset.passkey_lengths else []
    pk = {(m, n): c for m, n, c in pk_rows}
    retrieval = passkey_records(name, preset.train_len, pk, seed)
    for n in preset.recall_lengths:
        rows = cells.get("recall", n, _recall_cell, model, preset, methods, data.test, name, log, n, seed)
        retrieval += [RetrievalRecord.from_dict(r) for r in rows]
    timings[f"retrieval/{label}"] = time.perf_counter() - t
    log(f"eval {label}: done in {timings[f'eval/{label}']:.1f}s (+ retrieval {timings[f'retrieval/{label}']:.1f}s)")
    return recs, pk, retrieval


def _eval_cells_job(preset: BenchPreset, folder: Path, device: str, model: tuple) -> dict:
    """A worker's job in a parallel bench: compute the unfinished cells of one ``model`` (a :func:`_models`
    entry) into the cell folder (each cell file is committed atomically, so workers share the folder safely);
    returns ``{"computed": cells, "timings": {...}}``. The main process then reads every cell back."""
    from posenc.data.prepare import prepare

    data = prepare(preset.corpus, preset.tokenizer)
    timings: dict[str, float] = {}
    with StopSignals() as stop:
        cells = BenchCells(folder, preset, data, device, stop, tidy=False)
        _eval_model(preset, data, cells, *model, lambda msg: None, timings)
    return {"computed": cells.computed, "timings": timings}


def _evaluate_all(preset: BenchPreset, data, run_dirs: dict[str, Path], ft_dirs: dict[str, Path], device: str,
                  log, timings, cells, seed_runs=(), stop: StopSignals | None = None, ft_seeds=()
                  ) -> tuple[list[EvalRecord], list[RetrievalRecord]]:
    """Every model (:func:`_models`) at every length: the perplexity records and the retrieval records, each
    (model, length, probe) a cell of ``cells`` (:class:`~posenc.evals.lab.resume.BenchCells`): finished cells of
    an interrupted run are read back, not computed again. With ``preset.jobs > 1`` the models' cells are
    computed side by side in worker processes first (:func:`_eval_cells_job`), then read back here in order.
    Each record's ``extra["seed"]`` is the training seed of its model."""
    records: list[EvalRecord] = []
    retrieval: list[RetrievalRecord] = content_copy_records(preset, data.test)
    models = _models(preset, run_dirs, ft_dirs, seed_runs, ft_seeds)
    worker_timings: dict[str, float] = {}
    if preset.jobs > 1 and stop is not None and len(models) > 1:
        from posenc.runtime.parallel import Job, run_jobs

        t = time.perf_counter()
        jobs = [Job(f"eval {m[0] if m[1] == preset.seed else f'{m[0]}/seed{m[1]}'}", _eval_cells_job,
                    (preset, cells.store.folder, device, m)) for m in models]
        results, _ = run_jobs(jobs, preset.jobs, stop=stop, threads=preset.threads, log=log)
        timings["eval (wall, parallel)"] = time.perf_counter() - t
        for r in results:
            worker_timings.update(r["timings"])
            cells.reused -= r["computed"]  # read back below, but computed by this run
            cells.computed += r["computed"]
    read_log = log if not worker_timings else (lambda msg: None)  # the workers' lines said it already
    for name, seed, run_dir, methods in models:
        recs, pk, rows = _eval_model(preset, data, cells, name, seed, run_dir, methods, read_log, timings)
        retrieval += rows
        records += [_bench_record(EvalRecord.from_dict(r), name, name in ft_dirs, pk, seed) for r in recs]
    timings.update(worker_timings)  # where the work was done, not the read-back
    return records, retrieval


def _run(preset: BenchPreset, out_dir: Path, progress: bool, device: str, runs_dir, stop) -> dict:
    from posenc.data.prepare import prepare

    runs_dir = Path(runs_dir) if runs_dir is not None else out_dir / "runs"
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir)  # of results, reports and PNGs a killed run was writing (we hold the lock)
    log = _Log(progress)
    timings: dict[str, float] = {}
    machine = _machine(device)
    log(f"preset {preset.name}: {preset.description}; corpus {preset.corpus}; L={preset.train_len}; "
        f"eval {preset.eval_lengths}; {machine['cpu_count']} CPUs, torch {machine['torch']}")

    t = time.perf_counter()
    data = prepare(preset.corpus, preset.tokenizer)
    timings["prepare"] = time.perf_counter() - t
    log(f"data ready ({len(data.train)} train / {len(data.test)} test tokens, "
        f"{'cached' if data.from_cache else 'built'})")
    stop.check("nothing was trained yet")

    run_dirs = _train_all(preset, runs_dir, device, progress, log, timings, stop)
    ft_dirs, ft_seeds = _finetune_all(preset, runs_dir, run_dirs, device, progress, log, timings, stop)
    cells = BenchCells(out_dir / "cells", preset, data, device, stop)
    records, retrieval = _evaluate_all(preset, data, run_dirs, ft_dirs, device, log, timings, cells,
                                       _seed_runs(preset, runs_dir), stop, ft_seeds)
    if cells.reused:
        log(f"reused {cells.reused} finished evaluation cell(s) of an earlier run from {cells.store.folder}")
    tokens = data.test

    timings["total"] = log.elapsed()
    machine["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results = {"meta": {"preset": preset.name, "corpus": preset.corpus, "tokenizer": preset.tokenizer,
                        "machine": machine, "timings": {k: round(v, 2) for k, v in timings.items()},
                        "config": preset.to_dict(), "runs_dir": str(runs_dir),
                        "cells": {"reused": cells.reused, "computed": cells.computed},
                        "eval_split": "test", "eval_tokens": int(len(tokens)),
                        "passkey": "tasks.passkey_grid without the instruction sentence, teacher-forced exact match",
                        "recall": "posenc.tasks.recall: key-value recall in test-split text, exact match on the final "
                                  "query" if preset.recall_task == "recall" else
                                  "posenc.tasks.kv_recall: kv_recall (key matching) and offset (the token 2 after the "
                                  "key) in test-split text, exact match on the final query; content_copy rows: the "
                                  "control that copies a value of the window by content alone",
                        "ppl_windows": preset.eval_mode + (f": the last {preset.eval_kwargs['target_len']} tokens of "
                                                           f"windows ending at the same tokens at every length"
                                                           if preset.eval_mode == "tail" else "")},
               "records": _clean(records), "retrieval": [r.to_dict() for r in retrieval]}
    atomic_write_json(out_dir / "results.json", results, indent=1, default=str)
    paths = write_report(results, out_dir)
    log(f"wrote {out_dir / 'results.json'}, {paths['markdown'].name}, {paths['html'].name}")
    if progress:
        print(markdown_tables(results["records"]))
        print()
        print("\n".join(shape_checks(results["records"]) + retrieval_checks(results["retrieval"])))
        table = ppl_vs_retrieval_table(results["records"], results["retrieval"])
        if table:
            print()
            print(table)
    return results

