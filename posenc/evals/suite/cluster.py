"""The suite's cells on a cluster: every pending cell of a run is a Ray task, the cells folder the one source of truth.

A suite or a tune grid on a large model at long lengths is hundreds of GPU-hours of independent cells.
:func:`run_cells_ray` is :func:`posenc.evals.suite.runner.run_cells` with the cells dispatched through Ray
(``pip install 'posenc[ray]'``; ``posenc bench --preset ... --ray [ADDRESS]``) instead of run one after the other:

- **one cell per task**, asking for one GPU when the run's device is CUDA (and the preset's ``threads`` CPUs, 1 when
  unset, either way). A task loads the (method, length) model itself from the run's
  :class:`posenc.evals.suite.spec.ModelFacts` (device and dtype included; CUDA means the GPU Ray gave the task) and
  keeps it in its worker process, keyed by (model, method, parameters, length), so the next cell of the same group
  on that worker does not load it again; one model per worker at a time.
- **the cells folder is the single source of truth.** A task first reads its cell there and returns at once when it
  is finished; otherwise it computes it and stores it with :meth:`posenc.runtime.cells.CellStore.put_once`, which
  creates the file exclusively: a cell computed twice (a task retried after its worker died once the cell was
  stored, two runs racing) is written once, the first value kept. The folder must be one every node sees (a shared
  file system), as must the model's folder.
- **a killed worker's cell is recomputed**: a task whose worker dies (killed, out of memory, a node lost) is run
  again by Ray, up to :data:`MAX_RETRIES` times; an error raised by the cell itself is not retried, it ends the
  run (the cells finished so far are kept: run the same command to continue).
- **lengths in order.** Pruning (``prune_from``) decides whether a method runs at a length from its retrieval at
  the previous length (:func:`posenc.evals.suite.grid._pruned`), so the cells of one length are dispatched together
  and the next length waits for them; at the reference length, when pruning applies there, the untouched model's
  cells go first, since the others' pruning reads them (:func:`waves`). The left-out pairs are the sequential run's.

The driver then writes ``results.json`` and the report from the folder exactly as the sequential run does
(:func:`posenc.evals.suite.results.write_results`): the results equal the sequential run's but for the timing and
machine fields (:data:`posenc.evals.suite.results.MACHINE_FIELDS`, ``meta.machine``, ...), and ``meta.machine.ray``
describes the cluster.
The one-machine ``--jobs`` of the lab presets is unchanged.

``address``: ``None`` (or ``"local"``) starts a local cluster of this machine's CPUs and GPUs for the run and shuts
it down after, ``"auto"`` joins the cluster started on this node (``ray start --head``) or named by ``RAY_ADDRESS``,
any other value is a Ray address; a Ray session already open in the process is used as it is (and left open). Ray
is imported only inside the functions: posenc imports without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from posenc.runtime.cells import cell_digest

__all__ = ["CRASH_ONCE_ENV", "MAX_RETRIES", "require_ray", "run_cells_ray", "waves"]

MAX_RETRIES = 3
"""How many times Ray runs a cell again whose worker died (Ray's ``max_retries``)."""

CRASH_ONCE_ENV = "POSENC_SUITE_CRASH_ONCE"
"""Test hook (tests/evals/suite/test_cluster.py): a folder. A task of a cell armed there (a file ``<digest>.crash``,
:func:`posenc.runtime.cells.cell_digest`) writes one file ``<digest>.attempt-<pid>`` when it starts computing, and
on the first attempt kills its worker (``os._exit``) once the cell is computed, before it is stored."""

_WORKER: dict = {}  # per worker process: the model of the last group ("group", "model") and the model id


def require_ray(flag: str = "dispatch='ray'"):
    """The ``ray`` module; a one-line ``ModuleNotFoundError`` naming ``flag`` and the install command when Ray is
    not installed."""
    try:
        import ray
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise ModuleNotFoundError(f"{flag} needs Ray, which is not installed: pip install 'posenc[ray]'",
                                  name="ray") from None
    return ray


def waves(preset, length: int) -> list[tuple[str, ...]]:
    """The rows of ``preset`` at ``length`` in the groups dispatched one after the other: all at once, but at the
    reference length when pruning applies there the untouched model's first, since whether another row runs there
    depends on the untouched model's retrieval at that length."""
    if preset.prune_from is not None and preset.prune_from <= length == preset.reference_length:
        return [tuple(preset.methods[:1]), tuple(preset.methods[1:])] if len(preset.methods) > 1 else [preset.methods]
    return [tuple(preset.methods)]


def run_cells_ray(preset, m, store, *, log: Callable[[str], None], pruned, address: str | None = None,
                  cluster: dict | None = None) -> dict[str, str]:
    """Run every unfinished cell of ``preset`` as a Ray task (module docstring); ``m``: the run's
    :class:`posenc.evals.suite.spec.ModelFacts`, ``store``: its :class:`posenc.runtime.cells.CellStore`, ``pruned``: as
    for :func:`posenc.evals.suite.runner.run_cells`. Returns ``{"method@length": reason}`` for the pairs left out.
    ``cluster``: filled with what the cluster was (nodes, CPUs, GPUs, what a task asked for, models loaded)."""
    ray = require_ray()
    threads = preset.threads or 1
    need = {"num_cpus": threads, **({"num_gpus": 1} if _on_cuda(m.device) else {})}
    with _connected(ray, address) as local:
        facts = _check_fits(ray, need, strict=local, log=log)
        task = ray.remote(_run_cell).options(max_retries=MAX_RETRIES, retry_exceptions=False, **need)
        ref_m = ray.put(m)
        folder = str(Path(store.folder).resolve())
        skipped: dict[str, str] = {}
        stats = {"computed": 0, "model_loads": 0}
        for n in sorted(preset.lengths):
            for rows in waves(preset, n):
                jobs = [job for method in rows for job in _pending(preset, m, store, method, n, pruned, skipped, log)]
                jobs = list({cell_digest(job[0]): job for job in jobs}.values())  # rows that share cells: once
                refs = {task.remote(ref_m, folder, key, method, params, n, spec, s, preset.chat, threads):
                        (method, n, spec, s) for key, method, params, spec, s in jobs}
                _collect(ray, refs, log, stats)
    if cluster is not None:  # called once for the reference, then for the rest: the counts add up
        stats = {k: v + cluster.get(k, 0) for k, v in stats.items()}
        cluster.update({"address": address or "local", **facts, "task": need, **stats})
    return skipped


@contextmanager
def _connected(ray, address: str | None):
    """A Ray session for the run: the one open in this process, else a local cluster started for the run (and shut
    down after) or the cluster at ``address`` joined; yields whether it is a local cluster started here."""
    if address is not None and not address.strip():
        raise ValueError("--ray ADDRESS: the address is empty (leave it out for a local cluster, or 'auto')")
    if ray.is_initialized():
        yield False
        return
    local = address in (None, "local")
    ray.init(address="local" if local else address, **({"include_dashboard": False} if local else {}))
    try:
        yield local
    finally:
        ray.shutdown()


def _on_cuda(device) -> bool:
    return str(device).split(":")[0] == "cuda"


def _check_fits(ray, need: dict, *, strict: bool, log: Callable[[str], None]) -> dict:
    """The cluster's size; a node must hold what one task asks for, or no cell would ever start: ValueError for a
    cluster started here, a warning for one joined (an autoscaler may still add the node)."""
    nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
    facts = {"nodes": len(nodes), "cpus": sum(r.get("CPU", 0) for r in nodes),
             "gpus": sum(r.get("GPU", 0) for r in nodes)}
    if not any(r.get("CPU", 0) >= need["num_cpus"] and r.get("GPU", 0) >= need.get("num_gpus", 0) for r in nodes):
        asks = f"{need['num_cpus']} CPU(s)" + (" and 1 GPU" if need.get("num_gpus") else "")
        why = (f"--ray: a cell asks for {asks} (the preset's threads or --threads; a GPU when --device is cuda) but "
               f"no node of the Ray cluster has them ({facts['nodes']} node(s), {facts['cpus']:g} CPUs, "
               f"{facts['gpus']:g} GPUs in all)")
        if strict:
            raise ValueError(why)
        log(f"warning: {why}; the cells wait until such a node joins")
    return facts


def _pending(preset, m, store, method: str, n: int, pruned, skipped: dict, log) -> list[tuple]:
    """The unfinished cells ``(key, method, params, context, seed)`` of ``method`` at ``n``; none when the pair is
    left out (its reason is added to ``skipped`` and logged), as :func:`posenc.evals.suite.runner.run_cells` decides."""
    from posenc.evals.suite.spec import cell_key, cell_row

    row, params = cell_row(method, m.train_len, n, m.head_dim, m.base, preset.params)
    keys = [(cell_key(m.model_id, row, params, n, spec, s, preset.chat, device=m.device, dtype=m.dtype), spec, s)
            for spec in preset.contexts if spec.used_at(n, method) for s in spec.seed_range]
    pending = [(k, row, params, spec, s) for k, spec, s in keys if store.get(k) is None]
    why = pruned(store, m, preset, method, n) if pending else None
    if why:
        skipped[f"{method}@{n}"] = why
        log(f"{method} at {n}: left out ({why})")
        return []
    return pending


def _collect(ray, refs: dict, log: Callable[[str], None], stats: dict) -> None:
    """Wait for the tasks ``refs`` (ref -> cell), logging each cell as it finishes; on an error or an interruption
    the tasks still running are cancelled (their cells are not stored; the finished ones are)."""
    waiting = list(refs)
    try:
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            method, n, spec, s = refs[ready[0]]
            try:
                got = ray.get(ready[0])
            except Exception as exc:  # the cell's own error, or its worker died MAX_RETRIES + 1 times
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise RuntimeError(f"cell {method} @ {n} {spec.name} seed {s} failed on the Ray cluster ({first}); "
                                   "the cells finished so far are kept: run the same command to continue") from exc
            stats["computed"] += got["wrote"]
            stats["model_loads"] += got["loaded"]
            log(f"{method} @ {n} {spec.name} seed {s}: {got['summary']} ({got['worker']})")
    finally:
        for ref in waiting:
            ray.cancel(ref, force=True)


def _run_cell(m, folder: str, key: dict, method: str, params: dict, length: int, spec, seed: int, chat: bool,
              threads: int) -> dict:
    """One cell, in a Ray worker: read it from ``folder`` when it is finished, else compute it (the worker's model
    of its group, :func:`_model_for`) and store it with ``put_once``. Returns ``{"wrote", "loaded", "summary",
    "worker"}``."""
    import socket
    from dataclasses import replace

    import torch

    from posenc.evals.suite.runner import _one, _summary, cell_is_whole
    from posenc.runtime.cells import CellStore

    store = CellStore(folder, check=cell_is_whole)
    worker = f"{socket.gethostname()} pid {os.getpid()}"
    if store.get(key) is not None:
        return {"wrote": False, "loaded": False, "summary": "already in the cells folder", "worker": worker}
    crash = _attempt(key)
    torch.set_num_threads(threads)
    if _on_cuda(m.device):
        m = replace(m, device="cuda")  # the GPU Ray assigned: the only one the task sees (CUDA_VISIBLE_DEVICES)
    model, loaded = _model_for(m, method, params, length)
    once = _Once(store, crash)
    value = _one(once, key, model, m, spec, seed, length, chat)
    summary = _summary(value) if once.wrote else "computed, but another task had stored it first (kept)"
    return {"wrote": once.wrote, "loaded": loaded, "summary": summary, "worker": worker}


def _model_for(m, method: str, params: dict, length: int):
    """This worker's model of (model, method, parameters, length), loaded when the last cell it ran was of another
    group (the previous one freed first: one model per worker). Returns ``(model, loaded)``."""
    from posenc.evals.suite import runner as cells

    group = (m.model_id, str(m.device), m.dtype, method, json.dumps(params, sort_keys=True, default=str), length)
    if _WORKER.get("group") == group:
        return _WORKER["model"], False
    _WORKER.pop("model", None)
    _WORKER.pop("group", None)
    if _WORKER.get("model_id") != m.model_id:
        cells._HAYSTACKS.clear()  # tokenized with another model's tokenizer
    _free(m.device)
    model = m.fresh(method, params)
    _WORKER.update(group=group, model=model, model_id=m.model_id)
    return model, True


def _free(device) -> None:
    import gc

    gc.collect()
    if _on_cuda(device):
        import torch

        torch.cuda.empty_cache()


class _Once:
    """The store a worker's cell is written through: :meth:`posenc.runtime.cells.CellStore.put_once`, recording whether
    this task wrote it (the test hook's kill happens here, between computing and storing)."""

    def __init__(self, store, crash: bool):
        self.store, self.crash, self.wrote = store, crash, False

    def put(self, key: dict, value) -> None:
        if self.crash:
            os._exit(1)
        self.wrote = self.store.put_once(key, value)


def _attempt(key: dict) -> bool:
    """The test hook (:data:`CRASH_ONCE_ENV`): record an attempt of an armed cell; True on its first attempt."""
    folder = os.environ.get(CRASH_ONCE_ENV)
    if not folder:
        return False
    from posenc.runtime.cells import cell_digest

    base = Path(folder) / cell_digest(key)
    if not base.with_suffix(".crash").exists():
        return False
    from posenc.runtime.atomic import atomic_write_text

    atomic_write_text(base.with_name(f"{base.name}.attempt-{os.getpid()}"), "")  # one file per attempt (process)
    return len(list(base.parent.glob(f"{base.name}.attempt-*"))) == 1
