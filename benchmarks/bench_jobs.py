"""How a small machine trains the lab's models fastest: one model on one torch thread, one model on every core's
thread, or one model per core side by side (``posenc bench --jobs``, :mod:`posenc.runtime.parallel`).

Peers, in the same run, interleaved (A, B, C, A, B, C): the quick recipe (2 layers, dim 128, L = 64, 8 text + 32 kv
rows per step) for ``steps`` steps
- ``1 job x 1 thread``: one training in this process on one thread;
- ``1 job x C threads``: one training on ``C`` = the machine's cores threads;
- ``C jobs x 1 thread``: ``C`` trainings side by side in worker processes (their start included: what the bench
  pays).
The figure of merit is seconds per model (wall time / models trained); ``speedup`` is against ``1 job x 1 thread``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import cli


def _train_once(steps: int, threads: int, seed: int = 0) -> float:
    import torch

    from posenc.evals.lab import bench

    torch.set_num_threads(threads)
    preset = replace(bench.PRESETS["quick"], steps=steps)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        bench._train(preset, "rope", Path(d) / "rope", "cpu", False, seed=seed)
        return time.perf_counter() - t


def _side_by_side(steps: int, jobs: int) -> float:
    from posenc.runtime.interrupt import StopSignals
    from posenc.runtime.parallel import Job, run_jobs

    t = time.perf_counter()
    run_jobs([Job(f"model {i}", _train_once, (steps, 1, i)) for i in range(jobs)], jobs, stop=StopSignals(),
             log=lambda m: None)
    return time.perf_counter() - t


def run(quick: bool = False, n: int | None = None) -> dict:  # noqa: ARG001 - n: the shared CLI's, unused here
    import torch

    cores = os.cpu_count() or 1
    steps, repeats = (20, 1) if quick else (240, 3)
    old = torch.get_num_threads()
    peers = {"1 job x 1 thread": (1, lambda: _train_once(steps, 1)),
             f"1 job x {cores} threads": (1, lambda: _train_once(steps, cores)),
             f"{cores} jobs x 1 thread": (cores, lambda: _side_by_side(steps, cores))}
    samples: dict[str, list[float]] = {k: [] for k in peers}
    try:
        for _ in range(repeats):
            for name, (models, fn) in peers.items():
                samples[name].append(fn() / models)
    finally:
        torch.set_num_threads(old)
    base = statistics.median(samples["1 job x 1 thread"])
    rows = {name: {"seconds_per_model_median": statistics.median(v), "min": min(v), "max": max(v),
                   "repeats": len(v), "speedup": base / statistics.median(v)} for name, v in samples.items()}
    return {"steps": steps, "recipe": "quick (dim 128, 2 layers, L 64, 8 text + 32 kv rows per step)",
            "rows": rows, "summary": {k: round(r["speedup"], 2) for k, r in rows.items()}}


if __name__ == "__main__":
    raise SystemExit(cli("bench_jobs", run))
