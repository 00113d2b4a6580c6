"""Peak memory on the real model, one fresh process per method and length: what each method costs in resident memory
above the model itself, against the untouched model's.

    .venv/bin/python -m benchmarks.bench_real_model_memory [--lengths 8192,16384,32768] [--decode 4]
        [--methods yarn@engine,selfextend,...] [--layers 0] [--name bench_real_model_memory] [--out DIR]
    .venv/bin/python -m benchmarks.bench_real_model_memory --table benchmarks/results/bench_real_model_memory.json

Why a process per row: measured one after another in one process (``benchmarks.bench_real_model``), each row's
peak counts from a resident set that still holds memory freed by the rows before, so the peaks read low by a
varying amount. Here each (row, length) is a new ``python -m benchmarks.bench_real_model_memory --one ...``: it loads
SmolLM2-135M-Instruct in float32 (all 30 layers unless ``--layers``), applies the row's method through
``posenc.hf.extend`` (per-length parameters from :func:`posenc.methods.length_defaults`, the rows of
:data:`benchmarks.bench_real_model.METHODS`), runs an unrecorded warm-up (a prefill of 1024 tokens and two
steps: a fresh process's first forward allocates thread pools and buffers it keeps), then
:func:`benchmarks.bench_real_model.measure`: the heap trimmed and the kernel's peak-RSS mark reset, one prefill of
``n`` random tokens, ``--decode`` greedy cached steps (a window's rotated keys are cut to about its window by the
second step). Recorded per cell, in MB:

- ``peak_mb``: the high-water mark of the resident set over the prefill and the decode, above the resident set
  just before the prefill (after ``extend``): the transient of the prefill, the key/value cache, the rotated keys;
- ``prefill_peak_mb``: the same at the end of the prefill;
- ``rotated_keys_mb``: what the engine's rotated keys hold after the decode (:func:`posenc.hf.keys.stored_bytes`);
- ``kv_cache_mb``: the key/value cache itself after the decode (the part every row shares);
- ``extend_mb``: the resident memory ``extend`` added before the prefill (tables, wrappers).

The allocator is pinned: each cell's process runs with ``MALLOC_MMAP_THRESHOLD_=131072`` (:data:`ALLOCATOR`), so
glibc maps every block of 128 KiB or more on its own and unmaps it when it is freed. By default glibc raises that
threshold after the first large free (up to 32 MiB), and a layer's keys, values and activations (a few MiB each at
8k) then come from a heap that frees back to the system only in part: the whole model's peak at 8k read
772-831 MB for the untouched model's own computation with other cos/sin (PI, YaRN, Llama 3, transformers' code) and
was 240 MB apart between two engine rows that differ only in their frequencies. Pinned, four layers at 8k read
277-279 MB for those rows, and each engine row its rotated keys above them.

Memory does not depend on the machine's load, so this runs beside other work (the times it prints are not a
measurement). Resumable: the JSON is written atomically after every cell and a rerun skips the cells it holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, machine_info, write_json

LENGTHS = (8192, 16384, 32768)
UNTOUCHED = "untouched"
WARMUP = 1024  # tokens of the unrecorded warm-up prefill before each measurement
#: the environment of every cell's process: large blocks mapped and unmapped on their own (module docstring)
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def _row(label: str) -> tuple[str, dict, dict]:
    """``(method, fixed params, extend kwargs)`` of a row label: a row of
    :data:`benchmarks.bench_real_model.METHODS`, or ``<row>@lean``, that engine row with ``rotated_keys=False`` (the
    lean form: no rotated keys kept). ``ValueError`` naming ``--methods`` for an unknown label or the lean form of a
    row that runs on transformers' own code (it keeps no rotated keys to drop)."""
    from benchmarks.bench_real_model import LEAN_SUFFIX, METHODS, lean_row

    base = label.removesuffix(LEAN_SUFFIX)
    found = next((r for r in METHODS if r[0] == base), None)
    if found is None:
        known = ", ".join(r[0] for r in METHODS)
        raise ValueError(f"--methods: no row {label!r} in benchmarks.bench_real_model.METHODS ({known}, "
                         f"or <row>{LEAN_SUFFIX})")
    if base != label:
        found = lean_row(found)
        if found is None:
            raise ValueError(f"--methods: {label} is not a row: {base} runs on transformers' own code, which keeps "
                             "no rotated keys")
    _, method, fixed, kw = found
    return method, fixed, kw


def rows(labels=None) -> list[str]:
    """The row labels measured: the untouched model first, then :data:`benchmarks.bench_real_model.METHODS` (all,
    or those named in ``labels``, where ``<row>@lean`` names an engine row's lean form, :func:`_row`);
    ``ValueError`` naming ``--methods`` for an unknown label."""
    from benchmarks.bench_real_model import LEAN_SUFFIX, METHODS

    known = [r[0] for r in METHODS]
    if labels is None:
        return [UNTOUCHED, *known]
    wanted = [x for x in dict.fromkeys(labels) if x != UNTOUCHED]
    for label in wanted:
        _row(label)
    order = {label: i for i, label in enumerate(known)}

    def place(x: str) -> tuple[int, bool]:  # each row in METHODS' order, its lean form after it
        return order[x.removesuffix(LEAN_SUFFIX)], x.endswith(LEAN_SUFFIX)

    return [UNTOUCHED, *sorted(wanted, key=place)]


def _kv_cache_mb(cache) -> float:
    total = 0
    for layer in getattr(cache, "layers", []):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if t is not None and hasattr(t, "numel"):
                total += t.numel() * t.element_size()
    return total / 2 ** 20


def measure_one(label: str, n: int, decode: int, layers: int | None) -> dict:
    """One cell in this process (the ``--one`` entry): load, extend, measure (module docstring)."""
    import torch

    from benchmarks.bench_real_model import BASE, HEAD_DIM, TRAIN_LEN, _reset_peak, load_model, measure
    from posenc.hf import extend
    from posenc.methods import length_defaults

    torch.manual_seed(0)
    model = load_model(layers)
    before = _reset_peak()
    params = {}
    if label != UNTOUCHED:
        method, fixed, kw = _row(label)
        params = {**length_defaults(method, TRAIN_LEN, n, head_dim=HEAD_DIM, base=BASE), **fixed}
        extend(model, method, **kw, **params)
    extend_mb = (_reset_peak() - before) / 1024
    caches = []
    original = model.forward

    def keep_cache(*args, **kwargs):  # the last step's cache, to weigh it after the measurement
        out = original(*args, **kwargs)
        caches[:] = [out.past_key_values]
        return out

    model.forward = keep_cache
    measure(model, min(n, WARMUP), 2)  # unrecorded: a fresh process's first forward allocates for good (pools)
    caches.clear()
    res = measure(model, n, decode)
    return {"peak_mb": res["peak_mb"], "prefill_peak_mb": res["prefill_peak_mb"],
            "rotated_keys_mb": res["rotated_keys_mb"], "kv_cache_mb": _kv_cache_mb(caches[0]) if caches else None,
            "extend_mb": extend_mb, "params": params, "prefill_s": res["prefill_s"], "loadavg": res["loadavg"],
            "allocator": {k: os.environ.get(k) for k in ALLOCATOR}}


def _subprocess(label: str, n: int, decode: int, layers: int | None, timeout: float) -> dict:
    import subprocess

    cmd = [sys.executable, "-m", "benchmarks.bench_real_model_memory", "--one", label, "--lengths", str(n),
           "--decode", str(decode), "--layers", str(layers or 0)]
    root = Path(__file__).resolve().parent.parent
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(root),
                              env={**os.environ, **ALLOCATOR})
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0]}"}
    return json.loads(lines[-1])


def ratios(cells: dict) -> dict:
    """Per row, its peak over the untouched model's at the same length (None where either is missing)."""
    base = (cells.get(UNTOUCHED) or {}).get("peak_mb")
    return {label: (c["peak_mb"] / base if base and c.get("peak_mb") is not None else None)
            for label, c in cells.items() if label != UNTOUCHED}


def run(lengths=LENGTHS, labels=None, decode: int = 4, layers: int | None = None, out_dir=RESULTS,
        name: str = "bench_real_model_memory", timeout: float = 3600, log=print) -> dict:
    """Every (row, length) not yet in ``out_dir/name.json``, each in its own process; the JSON rewritten after each."""
    path = Path(out_dir) / f"{name}.json"
    prior = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    setup = {"decode": decode, "layers": layers or None, "allocator": ALLOCATOR, "warmup": WARMUP}
    if prior and {k: prior.get(k) for k in setup} != setup:
        raise ValueError(f"{path} holds a run with {({k: prior.get(k) for k in setup})}, not {setup}: "
                         f"pass --name for a new file")
    res = {"model": f"SmolLM2-135M-Instruct (float32, CPU, {'all' if not layers else layers} layers)", **setup,
           "lengths": prior.get("lengths", {}), "sittings": prior.get("sittings", [])}
    res["sittings"].append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "loadavg_start": list(os.getloadavg())})
    todo = [(n, label) for n in lengths for label in rows(labels)
            if "peak_mb" not in res["lengths"].get(str(n), {}).get("cells", {}).get(label, {})]
    log(f"{len(todo)} cells to measure ({len(lengths) * len(rows(labels)) - len(todo)} already in {path})")
    for i, (n, label) in enumerate(todo, 1):
        t0 = time.perf_counter()
        cell = _subprocess(label, n, decode, layers, timeout)
        entry = res["lengths"].setdefault(str(n), {"cells": {}})
        entry["cells"][label] = cell
        entry["peak_ratio"] = ratios(entry["cells"])
        res["sittings"][-1]["loadavg_end"] = list(os.getloadavg())
        write_json(name, res, out_dir)
        shown = f"peak {cell['peak_mb']:.0f} MB" if "peak_mb" in cell else cell.get("error")
        log(f"[{i}/{len(todo)}] {n} {label}: {shown} ({time.perf_counter() - t0:.0f} s)")
    return res


def table(res: dict) -> str:
    """Per row and length: peak MB above the model, its ratio to the untouched model's, and the rotated keys' MB."""
    lengths = sorted(res["lengths"], key=int)
    labels = []
    for n in lengths:
        labels += [k for k in res["lengths"][n]["cells"] if k not in labels]
    k = [f"{int(n) // 1024}k" if int(n) % 1024 == 0 else n for n in lengths]
    head = (["row"] + [f"peak {x} (MB, ratio)" for x in k] + [f"rotated keys {x} (MB)" for x in k]
            + [f"key/value cache {x} (MB)" for x in k])
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for label in labels:
        peaks, rot, kv = [], [], []
        for n in lengths:
            c = res["lengths"][n]["cells"].get(label) or {}
            r = res["lengths"][n].get("peak_ratio", {}).get(label)
            if "peak_mb" not in c:
                peaks.append(c.get("error", "-") if c else "-")
                rot.append("-")
                kv.append("-")
                continue
            peaks.append(f"{c['peak_mb']:.0f}" + ("" if r is None else f" ({r:.2f})"))
            rot.append(f"{c['rotated_keys_mb']:.0f}")
            kv.append(f"{c['kv_cache_mb']:.0f}" if c.get("kv_cache_mb") is not None else "-")
        lines.append("| " + " | ".join([label, *peaks, *rot, *kv]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.bench_real_model_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated prefill lengths")
    p.add_argument("--methods", default=None,
                   help="comma-separated row labels of bench_real_model, or <row>@lean for an engine row with "
                   "rotated_keys=False (default: every row, none lean)")
    p.add_argument("--decode", type=int, default=4, help="greedy cached steps after the prefill (default 4)")
    p.add_argument("--layers", type=int, default=0, help="the model's first N decoder layers (0: all)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per cell before it is recorded as an error")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="bench_real_model_memory", help="JSON file name (without .json) under --out")
    p.add_argument("--table", metavar="JSON", help="print the table of a finished run and exit")
    p.add_argument("--one", metavar="ROW", help=argparse.SUPPRESS)  # one cell in this process: the worker
    a = p.parse_args(argv)
    if a.table:
        print(table(json.loads(Path(a.table).read_text(encoding="utf-8"))))
        return 0
    try:
        lengths = [int(x) for x in a.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths must be comma-separated integers, got {a.lengths!r}")
    if a.one:
        print(json.dumps(measure_one(a.one, lengths[0], a.decode, a.layers or None)))
        return 0
    try:
        labels = rows(a.methods.split(",") if a.methods else None)
    except ValueError as e:
        p.error(str(e))
    res = run(lengths, labels, a.decode, a.layers or None, a.out, a.name, a.timeout)
    print(table(res))
    print(f"wrote {Path(a.out) / (a.name + '.json')} ({machine_info()['cores']} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
