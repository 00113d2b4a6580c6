"""``posenc perf``: run the benchmark suite in ``benchmarks/`` (see ``benchmarks/run_all.py``).

Writes ``<out>/<module>.json`` per benchmark and ``<out>/perf.md`` (a Markdown table with machine info).
The benchmarks live in the repository (not the installed package), so this command runs from a checkout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posenc.cli._common import add_out, deprecated, did_you_mean, subparser


def add_parser(sub) -> None:
    p = subparser(sub, "perf", "run the performance benchmarks (RoPE, attention, training, compile, generation)",
                  "Run the benchmarks of the repository's benchmarks/ folder (a checkout, not a wheel) and write "
                  "OUT/<benchmark>.json and OUT/perf.md. Every number is a ratio against peers timed in the same run.")
    p.add_argument("benchmarks", nargs="*", metavar="BENCHMARK", help="benchmark modules to run, e.g. bench_rope "
                   "(default: all of them)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in about a minute")
    add_out(p, "folder for the *.json files and perf.md (runs/ is git-ignored: a run never overwrites the "
               "committed benchmarks/results, which `make perf` writes)", default="runs/perf")
    deprecated(p, "--only", dest="old_only", use="give the benchmark names as positional arguments")
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
    only = list(args.benchmarks)
    if args.old_only:
        if only:
            raise ValueError("give the benchmarks as positional arguments or the old --only, not both")
        only = [s.strip() for s in args.old_only.split(",") if s.strip()]
    for name in only:
        if name not in run_all.MODULES:
            raise ValueError(f"unknown benchmark {name!r}{did_you_mean(name, run_all.MODULES)}; known: "
                             f"{', '.join(run_all.MODULES)}")
    res = run_all.run_all(quick=args.quick, out=args.out, only=only or None)
    return 1 if any("error" in r for r in res.values()) else 0
