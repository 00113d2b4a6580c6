"""How fast the command line starts: ``posenc --version``, ``posenc --help`` and every subcommand's ``--help``, each in
a fresh ``python -m posenc`` process (what a user waits for before anything is computed), plus ``import posenc``
and an empty interpreter (the floor every command pays).

The goals (``LIMITS_S``): ``--version`` and ``--help`` under 0.5 s, a subcommand's ``--help`` under 1 s, on the
median of ``repeats`` runs. The peers run interleaved round-robin (A, B, C, A, B, C) so a burst of load on the
shared machine hits all alike; the JSON keeps every sample and the load average. ``tests/benchmarks/test_startup.py``
reads the committed ``results/bench_startup.json`` and checks the goals.

``python -m benchmarks.bench_startup [--quick] [--out DIR]``
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import cli

ROOT = Path(__file__).resolve().parent.parent
LIMITS_S = {"top": 0.5, "subcommand_help": 1.0}  # --version / --help; any `posenc COMMAND --help`


def commands() -> dict[str, list[str]]:
    """Peer name -> the argv after ``python``: the two top-level calls, every subcommand's --help, and the floors."""
    from posenc.cli import SUBCOMMANDS

    out = {"posenc --version": ["-m", "posenc", "--version"], "posenc --help": ["-m", "posenc", "--help"]}
    out.update({f"posenc {name} --help": ["-m", "posenc", name, "--help"] for name in SUBCOMMANDS})
    out.update({"import posenc": ["-c", "import posenc"], "python (empty)": ["-c", "pass"]})
    return out


def limit_of(name: str) -> float | None:
    """The goal of one peer in seconds (None for the floors, which are reported, not judged)."""
    if name in ("posenc --version", "posenc --help"):
        return LIMITS_S["top"]
    if name.startswith("posenc ") and name.endswith(" --help"):
        return LIMITS_S["subcommand_help"]
    return None


def _once(argv: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"python {' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return dt


def run(quick: bool = False, n: int | None = None) -> dict:  # noqa: ARG001 - n: the shared CLI's, unused here
    repeats = 2 if quick else 7
    peers = commands()
    for argv in peers.values():  # one untimed run each: the bytecode caches written, the files in the page cache
        _once(argv)
    samples: dict[str, list[float]] = {k: [] for k in peers}
    for _ in range(repeats):
        for name, argv in peers.items():
            samples[name].append(_once(argv))
    rows = {name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s), "samples_s": s,
                   "limit_s": limit_of(name)} for name, s in samples.items()}
    judged = {k: r for k, r in rows.items() if r["limit_s"] is not None}
    summary = {"repeats": repeats, "slowest": max(judged, key=lambda k: judged[k]["median_s"] / judged[k]["limit_s"]),
               "all_within_limits": all(r["median_s"] < r["limit_s"] for r in judged.values()),
               **{k: round(r["median_s"], 3) for k, r in rows.items()}}
    return {"limits_s": LIMITS_S, "python": sys.executable, "rows": rows, "summary": summary}


if __name__ == "__main__":
    raise SystemExit(cli("bench_startup", run))
