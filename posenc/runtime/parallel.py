"""Independent pieces of a bench (the trainings of different models, the evaluation cells of different models) run
in worker processes, so a bench at one torch thread per model uses every core it is given (``posenc bench
--jobs N``; presets say their own ``jobs``).

Why processes and one thread each: the lab's models are tiny (dim 128, 2 layers), so a training step is bound by
operator overhead, not by FLOPs, and a second intra-op thread buys little; two models trained side by side on two
cores take about the time of one. Each job is a fresh interpreter (multiprocessing's ``spawn``: nothing of the
parent's torch state is forked) with ``threads`` torch threads. A job's result depends only on its arguments, so a
model trained in a worker has the same weights as one trained in the main process
(``tests/runtime/test_parallel.py``).

Stopping: when the parent's :class:`~posenc.runtime.interrupt.StopSignals` records SIGINT or SIGTERM, every running
worker is sent SIGTERM, which its own ``StopSignals`` (training, bench cells) turns into "save, then stop"; no
new job starts, and :func:`run_jobs` raises :class:`~posenc.runtime.interrupt.Interrupted` after the workers have
saved and exited. A job that fails stops the others the same way and raises ``RuntimeError`` naming the job
(the worker's traceback is on stderr above it). Nothing is left running: a worker that outlives its stop by
``grace`` seconds is killed (it resumes from its last checkpoint or cell, like any killed run).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from posenc.runtime.interrupt import Interrupted, StopSignals

__all__ = ["Job", "run_jobs"]


@dataclass(frozen=True)
class Job:
    """One piece of work: ``fn(*args, **kwargs)`` in a worker; ``fn`` a module-level function, the arguments and
    the result picklable. ``label`` names it in log lines and errors."""

    label: str
    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def _worker(conn, job: Job, threads: int | None) -> None:
    """A worker's body: run ``job`` and send ``("ok", result)``, ``("stopped", message)`` or ``("error", what)``."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    try:
        result = job.fn(*job.args, **job.kwargs)
    except Interrupted as exc:  # saved what it had: a clean stop, not a failure
        conn.send(("stopped", str(exc)))
        conn.close()
        sys.exit(exc.exit_status)
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        conn.close()
        raise  # the traceback goes to stderr
    conn.send(("ok", result))
    conn.close()


def run_jobs(jobs: list[Job], workers: int, *, stop: StopSignals, threads: int | None = 1,
             log: Callable[[str], None] = print, grace: float = 600.0) -> tuple[list, dict[str, float]]:
    """Run ``jobs`` at most ``workers`` at a time; returns ``(results in the order of jobs, {label: seconds})``.

    See the module docstring for stops and failures. ``threads``: torch threads per worker (None: torch's
    default). ``grace``: seconds a stopped worker gets to save before it is killed."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers!r}")
    ctx = mp.get_context("spawn")
    results: list = [None] * len(jobs)
    seconds: dict[str, float] = {}
    pending = list(enumerate(jobs))
    running: dict = {}  # conn -> (index, job, process, t0)
    failure: str | None = None
    stopping_since: float | None = None
    ok = 0
    try:
        while pending or running:
            while pending and len(running) < workers and not stop.requested and failure is None:
                i, job = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker, args=(send, job, threads), name=f"posenc job: {job.label}")
                proc.start()
                send.close()  # the child holds the only writing end: EOF when it dies
                running[recv] = (i, job, proc, time.perf_counter())
                log(f"{job.label}: started in worker pid {proc.pid}")
            if not running:
                break
            for conn in wait(list(running), timeout=0.5):
                i, job, proc, t0 = running.pop(conn)
                try:
                    status, payload = conn.recv()
                except EOFError:  # died without a word (killed, out of memory)
                    status, payload = "error", "the worker died without a result"
                conn.close()
                proc.join()
                seconds[job.label] = time.perf_counter() - t0
                if status == "ok":
                    results[i] = payload
                    ok += 1
                    log(f"{job.label}: done in {seconds[job.label]:.1f}s")
                elif status == "stopped":
                    log(f"{job.label}: {payload}")
                elif stopping_since is not None and proc.exitcode in (-15, -9):
                    log(f"{job.label}: stopped before it had anything to save")  # our SIGTERM beat its handler
                elif failure is None:
                    failure = f"{job.label} failed in its worker (exit code {proc.exitcode}): {payload}"
            if (stop.requested or failure is not None) and running:
                if stopping_since is None:
                    stopping_since = time.perf_counter()
                    for _, _, proc, _ in running.values():
                        proc.terminate()  # SIGTERM: the worker saves, then stops
                elif time.perf_counter() - stopping_since > grace:
                    for _, _, proc, _ in running.values():
                        proc.kill()
    finally:
        for conn, (_, _, proc, _) in running.items():  # an exception in the parent: leave nothing running
            proc.kill()
            proc.join()
            conn.close()
    if failure is not None:
        raise RuntimeError(failure + " (its traceback is above)")
    stop.check(lambda sig: f"interrupted by {sig}: {ok} of {len(jobs)} job(s) finished, the others saved their "
                           f"progress; run the same command again to continue from there")
    return results, seconds
