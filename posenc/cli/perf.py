"""``posenc perf``: run the benchmark suite in ``benchmarks/`` (see ``benchmarks/run_all.py``).

Writes ``<out>/<module>.json`` per benchmark and ``<out>/perf.md`` (a Markdown table with machine info).
The benchmarks live in the repository (not the installed package), so this command runs from a checkout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("perf", help="run the performance benchmarks (RoPE, attention, training, compile)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in about a minute")
    p.add_argument("--out", default="benchmarks/results", help="output folder for *.json and perf.md")
    p.add_argument("--only", default="", help="comma-separated benchmark modules, e.g. bench_rope")
    p.set_defaults(func=run)


def _import_run_all():
    """``benchmarks.run_all``, from ``sys.path`` when it is there (``python -m posenc`` in the checkout),
    else from the checkout that holds this package.

    The one place where posenc reaches outside its package: ``benchmarks/`` is not installed (it measures
    posenc against peer libraries and is not part of the library), so an editable install's console
    script finds it next to ``posenc/`` by putting the checkout's root on ``sys.path``. A wheel install
    has no such folder and gets a ``ValueError``."""
    try:
        from benchmarks import run_all
    except ModuleNotFoundError as exc:
        root = Path(__file__).resolve().parents[2]  # <root>/posenc/cli/perf.py -> <root>
        if not (root / "benchmarks" / "run_all.py").exists():
            raise ValueError("posenc perf needs the repository's benchmarks/ folder (run it from a checkout)") from exc
        sys.path.insert(0, str(root))
        from benchmarks import run_all
    return run_all


def run(args: argparse.Namespace) -> int:
    run_all = _import_run_all()
    only = [s.strip() for s in (args.only or "").split(",") if s.strip()] or None
    unknown = sorted(set(only or ()) - set(run_all.MODULES))
    if unknown:
        raise ValueError(f"--only: unknown benchmark(s) {unknown}; known: {', '.join(run_all.MODULES)}")
    res = run_all.run_all(quick=args.quick, out=args.out, only=only)
    return 1 if any("error" in r for r in res.values()) else 0
