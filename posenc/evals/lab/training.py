"""Training a bench preset's models: every trained scheme at its seeds (:func:`_train_all`) and every fine-tune row
at its seeds (:func:`_finetune_all`, :func:`finetune_seeds`), one after another or side by side in worker
processes (``preset.jobs``, :mod:`posenc.runtime.parallel`); each run resumes from its last checkpoint or is reused
when finished (:func:`posenc.evals.lab.resume.train_or_reuse`). :mod:`posenc.evals.lab.bench` runs them, then evaluates.
"""

from __future__ import annotations

import time
from pathlib import Path

from posenc.evals.lab.presets import BenchPreset, FineTune, scheme_spec
from posenc.evals.lab.resume import save_every, train_or_reuse
from posenc.runtime.interrupt import StopSignals

__all__ = ["finetune_seeds"]


def _train_config(preset: BenchPreset, scheme: str, run_dir: Path, device: str, *, steps=None, train_len=None,
                  init=None, scheme_params=None, options=None, seed=None, schedule=None):
    """The ``posenc.training.train.TrainConfig`` of one model (``scheme`` a preset name; with ``init`` a method name
    applied to that checkpoint's scheme; ``schedule``: a fine-tune's ``lr``/``min_lr``/``warmup``,
    :meth:`FineTune.schedule`)."""
    from posenc.training.train import TrainConfig

    steps = steps or preset.steps
    sched = schedule or {"lr": preset.lr, "min_lr": min(preset.lr, 1e-4), "warmup": min(preset.warmup, steps // 5)}
    return TrainConfig(out_dir=str(run_dir), corpus=str(preset.corpus), tokenizer=preset.tokenizer, scheme=scheme,
                       scheme_params=dict(scheme_params or {}), dim=preset.dim, n_layers=preset.n_layers,
                       n_heads=preset.n_heads, train_len=train_len or preset.train_len,
                       batch_size=preset.batch_size, steps=steps, **sched,
                       seed=preset.seed if seed is None else seed, init=init, device=device,
                       save_every=save_every(steps), eval_batches=preset.val_batches, recall_batch=preset.recall_batch,
                       recall_weight=preset.recall_weight, recall_pairs=preset.recall_pairs,
                       recall_task=preset.recall_task, **dict(options or {}))


def _train(preset, scheme, run_dir: Path, device: str, progress: bool, **kw) -> dict:
    from posenc.training.train import train

    summary = train(_train_config(preset, scheme, run_dir, device, **kw), progress=progress)
    return dict(summary or {})


def _run_dir(runs_dir: Path, scheme: str, seed: int, preset: BenchPreset) -> Path:
    """``runs_dir/<scheme>`` for the preset's seed (the folder of a single-seed run), ``<scheme>-seed<k>`` else."""
    name = scheme.replace(":", "-").replace(",", "-").replace("=", "")
    return runs_dir / (name if seed == preset.seed else f"{name}-seed{seed}")


def _train_all(preset: BenchPreset, runs_dir: Path, device: str, progress: bool, log, timings,
               stop: StopSignals | None = None) -> dict[str, Path]:
    """Train (or reuse) every scheme of ``preset`` at each of its seeds (:meth:`BenchPreset.seeds_for`):
    ``{scheme: run_dir}`` of the preset's own seed; the other seeds' folders are :func:`_seed_runs`. With
    ``preset.jobs > 1`` the unfinished ones train side by side in worker processes (:mod:`posenc.runtime.parallel`)."""
    run_dirs: dict[str, Path] = {}
    todo: list[tuple[str, str, Path, tuple, dict]] = []  # (label, timing key, run_dir, args, kwargs) of _train
    for scheme in preset.schemes:
        name, params = scheme_spec(scheme)
        for seed in preset.seeds_for(scheme):
            run_dir = _run_dir(runs_dir, scheme, seed, preset)
            label = scheme if seed == preset.seed else f"{scheme} seed {seed}"
            key = f"train/{scheme}" if seed == preset.seed else f"train/{scheme}/seed{seed}"
            if seed == preset.seed:
                run_dirs[scheme] = run_dir
            todo.append((label, key, run_dir, (preset, name, run_dir, device, progress),
                         {"scheme_params": params, "seed": seed}))
    plan = f"{preset.steps} steps x {preset.batch_size} x {preset.train_len}"
    if preset.jobs > 1 and stop is not None:
        from posenc.runtime.parallel import Job, run_jobs

        jobs = []
        for label, _key, run_dir, args, kwargs in todo:
            train_or_reuse(f"train {label}", plan, run_dir, preset.steps, log, _queue, jobs,
                           Job(f"train {label}", _train, (*args[:-1], False), kwargs))
        t = time.perf_counter()
        _, seconds = run_jobs(jobs, preset.jobs, stop=stop, threads=preset.threads, log=log)
        if jobs:
            timings["train (wall, parallel)"] = time.perf_counter() - t
        for label, key, *_ in todo:
            if f"train {label}" in seconds:
                timings[key] = seconds[f"train {label}"]
        return run_dirs
    for label, key, run_dir, args, kwargs in todo:
        t = time.perf_counter()
        train_or_reuse(f"train {label}", plan, run_dir, preset.steps, log, _train, *args, **kwargs)
        timings[key] = time.perf_counter() - t
        log(f"train {label}: done in {timings[key]:.1f}s")
    return run_dirs


def _queue(jobs: list, job) -> None:
    """:func:`train_or_reuse`'s ``train`` for a parallel bench: queue the training instead of running it."""
    jobs.append(job)


def _seed_runs(preset: BenchPreset, runs_dir: Path) -> list[tuple[str, int, Path]]:
    """``(scheme, seed, run_dir)`` of every extra seed (besides the preset's own) that :func:`_train_all` trains."""
    return [(scheme, seed, _run_dir(runs_dir, scheme, seed, preset)) for scheme in preset.schemes
            for seed in preset.seeds_for(scheme) if seed != preset.seed]


def _root(preset: BenchPreset, ft: FineTune) -> str:
    """The trained scheme a fine-tune row starts from, through earlier rows (a schedule); a from-scratch row's
    own trained preset (its ``method``)."""
    rows = {r.name: r for r in preset.finetunes}
    while ft.base in rows:
        ft = rows[ft.base]
    return ft.method if ft.base is None else ft.base


def finetune_seeds(preset: BenchPreset, ft: FineTune) -> list[int]:
    """The seeds a fine-tune row runs at: with ``preset.seed_finetunes`` those of the scheme it starts from
    (:meth:`BenchPreset.seeds_for`), each continued from that seed's checkpoint and trained on that seed's data
    order; else the preset's seed only."""
    return preset.seeds_for(_root(preset, ft)) if preset.seed_finetunes else [preset.seed]


def _depth(preset: BenchPreset, ft: FineTune) -> int:
    """0 for a row based on a trained scheme (or from scratch), 1 + its base's for a row based on another row."""
    rows = {r.name: r for r in preset.finetunes}
    return 0 if ft.base not in rows else 1 + _depth(preset, rows[ft.base])


def _finetune_all(preset: BenchPreset, runs_dir: Path, run_dirs: dict[str, Path], device: str, progress: bool,
                  log, timings, stop: StopSignals | None = None) -> tuple[dict[str, Path], list]:
    """Fine-tune (or reuse) every row of ``preset.finetunes`` whose base was trained, at each of its seeds
    (:func:`finetune_seeds`): ``({name: run_dir} of the preset's seed, [(name, seed, run_dir)] of the others)``.
    Rows run in waves by :func:`_depth` (a schedule's second stage after its first); with ``preset.jobs > 1`` the
    rows of a wave train side by side (:mod:`posenc.runtime.parallel`)."""
    trained = {(scheme, seed): _run_dir(runs_dir, scheme, seed, preset)
               for scheme in preset.schemes for seed in preset.seeds_for(scheme)}
    dirs: dict[tuple[str, int], Path] = {}
    for depth in sorted({_depth(preset, ft) for ft in preset.finetunes}):
        todo = []
        for ft in preset.finetunes:
            if _depth(preset, ft) != depth:
                continue
            if ft.base is not None and ft.base not in run_dirs and not any(k[0] == ft.base for k in dirs):
                log(f"fine-tune {ft.name}: skipped, base {ft.base!r} not trained in this preset")
                continue
            for seed in finetune_seeds(preset, ft):
                todo.append(_finetune_job(preset, runs_dir, ft, seed, {**trained, **dirs}, device, progress))
                dirs[(ft.name, seed)] = todo[-1][2]
        if preset.jobs > 1 and stop is not None and len(todo) > 1:
            from posenc.runtime.parallel import Job, run_jobs

            jobs: list = []
            for label, _key, run_dir, steps, plan, kwargs in todo:
                train_or_reuse(label, plan, run_dir, steps, log, _queue, jobs, Job(label, _train, (
                    preset, kwargs.pop("scheme"), run_dir, device, False), kwargs))
            _, seconds = run_jobs(jobs, preset.jobs, stop=stop, threads=preset.threads, log=log)
            timings.update({key: seconds[label] for label, key, *_ in todo if label in seconds})
            continue
        for label, key, run_dir, steps, plan, kwargs in todo:
            t = time.perf_counter()
            train_or_reuse(label, plan, run_dir, steps, log, _train, preset, kwargs.pop("scheme"), run_dir, device,
                           progress, **kwargs)
            timings[key] = time.perf_counter() - t
    ft_dirs = {name: d for (name, seed), d in dirs.items() if seed == preset.seed}
    extra = [(name, seed, d) for (name, seed), d in dirs.items() if seed != preset.seed]
    return ft_dirs, extra


def _finetune_job(preset: BenchPreset, runs_dir: Path, ft: FineTune, seed: int, bases: dict, device: str,
                  progress: bool) -> tuple[str, str, Path, int, str, dict]:
    """``(label, timing key, run_dir, steps, plan, _train keywords with "scheme")`` of row ``ft`` at ``seed``;
    ``bases``: ``{(scheme or row, seed): run_dir}`` of what is trained (or queued in an earlier wave)."""
    own = seed == preset.seed
    run_dir = runs_dir / (ft.name if own else f"{ft.name}-seed{seed}")
    ft_len = ft.len_factor * preset.train_len
    init = None if ft.base is None else str(bases[(ft.base, seed)])
    scheme, params = ft.method, ft.params
    if init is not None and ft.scheme_from not in (None, ft.base):  # a schedule's next stage: a new scale
        from posenc.models.checkpoint import load_model

        scheme, params = load_model(bases[(ft.scheme_from, seed)]).scheme.extend(ft.method, **ft.params).to_dict(), {}
    schedule = None if init is None else ft.schedule(preset.lr)  # a fine-tune warms up again, lower peak
    label = f"fine-tune {ft.name}" + ("" if own else f" seed {seed}")
    plan = (f"{ft.method} {ft.params} {ft.options} from {init or 'scratch'}, {ft.steps} steps at {ft_len}"
            + (f", lr {schedule['lr']:g} after {schedule['warmup']} warmup steps" if schedule else ""))
    kwargs = {"scheme": scheme, "steps": ft.steps, "train_len": ft_len, "init": init, "scheme_params": params,
              "options": ft.options, "schedule": schedule, **({} if own else {"seed": seed})}
    return label, f"finetune/{ft.name}" + ("" if own else f"/seed{seed}"), run_dir, ft.steps, plan, kwargs
