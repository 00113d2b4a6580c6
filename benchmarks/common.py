"""Shared helpers for the benchmarks: robust timing, peak memory in a fresh subprocess, machine info, JSON.

The machine is shared (other jobs run tests at the same time), so every timing is the median of several
repeats, reported with its min and max so the noise is visible; ratios compare peers timed in the same run,
interleaved round-robin so a burst of load hits every peer alike.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from posenc.runtime.atomic import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"


def machine_info() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "loadavg": load}


def time_peers(fns: dict, repeats: int = 5, warmup: int = 1, min_time: float = 0.0) -> dict:
    """Time each callable in ``fns`` ``repeats`` times, interleaved (peer A, B, C, A, B, C, ...).

    Returns ``{name: {"median_ms", "min_ms", "max_ms", "repeats"}}``. ``warmup`` untimed calls each first.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {k: summarize(v) for k, v in samples.items()}


def summarize(seconds: list) -> dict:
    ms = [s * 1e3 for s in seconds]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "repeats": len(ms)}


def peak_memory_subprocess(module: str, args: list, timeout: float = 600) -> dict:
    """Run ``python -m module *args`` in a fresh process; it prints one JSON line (see :func:`measure_peak`)."""
    env = dict(os.environ)
    try:
        proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=str(Path(__file__).resolve().parent.parent))
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["failed"]}
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": "no JSON output"}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def trim_heap() -> bool:
    """Hand the heap's freed memory back to the kernel (glibc's ``malloc_trim(0)``; False where there is no glibc).

    Freed blocks that malloc keeps count in the resident set: measured after an earlier run in the same process,
    ``VmRSS`` before a call then includes memory the call reuses without raising ``VmHWM``, and its extra memory
    reads low by whatever the earlier run left (a whole-model 16k prefill of SmolLM2 read 324 MiB above the model,
    less than its own key/value cache, 720 MiB)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = getattr(libc, "malloc_trim", None)
    except OSError:
        trim = None
    if trim is None:
        return False
    trim(0)
    return True


def measure_peak(fn) -> dict:
    """Extra resident memory of ``fn()`` in this process: VmHWM after the call minus VmRSS before it.

    The high-water mark is reset first (``echo 5 > /proc/self/clear_refs``); torch's CPU allocations are
    plain malloc/mmap, so they show up in RSS (tracemalloc would not see them).
    """
    import gc

    gc.collect()
    trim_heap()
    reset = True
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        reset = False
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    del out
    return {"extra_mb": (peak - before) / 1024, "rss_before_mb": before / 1024, "hwm_reset": reset,
            "seconds": dt}


def seed_range(text: str, example: str = "0-7") -> list[int]:
    """``--seeds``: a seed or an inclusive range ``lo-hi``; ``SystemExit`` naming the flag otherwise."""
    lo, _, hi = text.partition("-")
    try:
        return list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit(f"--seeds takes a seed or a range such as {example}, got {text!r}") from None


def write_json(name: str, payload: dict, out_dir: Path | str | None = None) -> Path:
    out = Path(out_dir) if out_dir is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    payload = {"benchmark": name, "machine": machine_info(), **payload}
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False, default=str))


def cli(name: str, run, argv=None) -> int:
    """Standard ``--quick / --n / --out`` entry point shared by every benchmark module."""
    import argparse

    p = argparse.ArgumentParser(prog=f"benchmarks.{name}")
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (smoke test)")
    p.add_argument("--n", type=int, default=None, help="override the sequence length(s) with this one")
    p.add_argument("--out", default=str(RESULTS), help="directory for <name>.json")
    a = p.parse_args(argv)
    res = run(quick=a.quick, n=a.n)
    path = write_json(name, res, a.out)
    print(json.dumps(res.get("summary", {}), indent=1, default=str))
    print(f"wrote {path}")
    return 0
