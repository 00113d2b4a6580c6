"""What every section of the GPU script shares: the run record (one JSON, rewritten after every item, so a run
cut short by its time limit still leaves everything it measured), the time budget, device timing, the ceilings.

Timing on CUDA: ``torch.cuda.synchronize()`` around each repeat, warm-up calls first (compilation, autotuning and
allocator growth stay out of the numbers), the median of the repeats; peers of one comparison are timed
interleaved (A, B, A, B, ...) on the same card in the same process, so a clock change hits both alike.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import statistics
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch


def _atomic():
    """posenc's atomic writer (:mod:`posenc.runtime.atomic`, which imports nothing of posenc), loaded from its file so
    the record is written even where the posenc package itself does not import."""
    path = Path(__file__).resolve().parents[2] / "posenc" / "runtime" / "atomic.py"
    spec = importlib.util.spec_from_file_location("_gpu_script_atomic", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ATOMIC = _atomic()


def card_slug(device: torch.device) -> str:
    """``h100``, ``h200``, ``a100``, ... from the CUDA device name (``cpu`` for a dry run)."""
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower()
    m = re.search(r"\b([a-z]{1,2}\d{2,4}[a-z]?)\b", name.replace("nvidia", " "))
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", name).strip("-")


class Run:
    """The record of one run of the script: ``data`` (written to ``path`` after every item), the deadline, the
    log. ``item(section, name)`` runs one check or measurement: its exception is recorded (with the traceback's
    tail) and the run goes on; an item started with less than ``need`` seconds left is skipped and recorded as
    such."""

    def __init__(self, path: Path, log_path: Path, budget_s: float, device: torch.device, dtype: torch.dtype,
                 dry_run: bool):
        self.path, self.t0, self.budget = path, time.perf_counter(), budget_s
        self.log_path, self.log_lines = log_path, []
        self.device, self.dtype, self.dry_run = device, dtype, dry_run
        self.section_end: float | None = None
        self.data: dict = {"script": "benchmarks/gpu/run.py", "dry_run": dry_run, "budget_s": budget_s,
                           "device": describe_device(device), "dtype": str(dtype).split(".")[-1],
                           "versions": versions(), "sections": {}, "errors": [], "skipped": []}

    def left(self) -> float:
        """Seconds left: of the whole budget, or of the current section's share (:meth:`share`)."""
        now = time.perf_counter()
        total = self.budget - (now - self.t0)
        return total if self.section_end is None else min(total, self.section_end - now)

    @contextmanager
    def share(self, fraction: float):
        """Items inside get at most ``fraction`` of the whole budget (from now), so one slow section cannot starve
        the others; time a section leaves unused goes to the next."""
        self.section_end = time.perf_counter() + fraction * self.budget
        try:
            yield
        finally:
            self.section_end = None

    def log(self, msg: str) -> None:
        line = f"[{time.perf_counter() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.log_lines.append(line)
        ATOMIC.atomic_write_text(self.log_path, "\n".join(self.log_lines) + "\n")

    def put(self, section: str, key: str, value) -> None:
        self.data["sections"].setdefault(section, {})[key] = value
        self.save()

    def add(self, section: str, key: str, row: dict) -> None:
        self.data["sections"].setdefault(section, {}).setdefault(key, []).append(row)
        self.save()

    @contextmanager
    def item(self, section: str, name: str, need: float = 5.0):
        """Run the body as one item; yields True to run it, False when it is skipped for lack of time."""
        if self.left() < need:
            self.data["skipped"].append({"section": section, "item": name, "reason": f"{self.left():.0f} s left "
                                         f"of the budget, {need:.0f} s needed"})
            self.log(f"skip {section}/{name}: budget")
            self.save()
            yield False
            return
        t = time.perf_counter()
        try:
            yield True
        except Exception as exc:  # noqa: BLE001 - every failure is a result of this script
            tb = traceback.format_exc().strip().splitlines()
            self.data["errors"].append({"section": section, "item": name, "error": f"{type(exc).__name__}: {exc}"[:600],
                                        "traceback": tb[-12:]})
            self.log(f"ERROR {section}/{name}: {type(exc).__name__}: {str(exc)[:300]}")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        finally:
            self.log(f"done {section}/{name} in {time.perf_counter() - t:.1f} s")
            self.save()

    def save(self) -> None:
        self.data["wall_s"] = round(time.perf_counter() - self.t0, 2)
        ATOMIC.atomic_write_text(self.path, json.dumps(self.data, indent=1, default=str))


def describe_device(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"type": device.type, "name": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    p = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": torch.cuda.get_device_name(device), "card": card_slug(device),
            "memory_gib": round(p.total_memory / 2 ** 30, 1), "sms": p.multi_processor_count,
            "capability": f"{p.major}.{p.minor}"}


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda if torch.cuda.is_available() else None}
    for name in ("transformers", "triton"):
        try:
            out[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - absent or broken: say which
            out[name] = f"not importable: {type(exc).__name__}: {exc}"[:200]
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fns(fns: dict, device: torch.device, reps: int = 5, warmup: int = 1) -> dict:
    """``{name: median seconds}`` of each callable, interleaved, after ``warmup`` calls each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    samples: dict = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(device)
            t = time.perf_counter()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}


def ceilings(run: Run) -> None:
    """The two ceilings of the card, measured in this run: a large device-to-device copy (bytes read + written)
    and a large bf16 matrix product (fp32 on the CPU), on random data."""
    dev = run.device
    n = (1 << 28) if dev.type == "cuda" else (1 << 20)  # 512 MiB of bf16 on the card
    x = torch.randn(n, device=dev, dtype=run.dtype)
    y = torch.empty_like(x)
    t = time_fns({"copy": lambda: y.copy_(x)}, dev, reps=10)["copy"]
    m = 8192 if dev.type == "cuda" else 256
    a, b = (torch.randn(m, m, device=dev, dtype=run.dtype) for _ in range(2))
    tm = time_fns({"mm": lambda: a @ b}, dev, reps=10)["mm"]
    run.put("ceilings", "copy_GBps", round(2 * x.numel() * x.element_size() / t / 1e9, 1))
    run.put("ceilings", "matmul_TFLOPs", round(2 * m ** 3 / tm / 1e12, 1))
    run.put("ceilings", "matmul_shape", [m, m, m])


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| (posenc's test metric), in float64; inf for a non-finite output."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def python_exe() -> str:
    return sys.executable
