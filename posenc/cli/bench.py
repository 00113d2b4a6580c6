"""``posenc bench``: train short, test long (:func:`posenc.lab.bench.run_bench`)."""

from __future__ import annotations

import argparse

from posenc.cli._common import add_device, add_quiet


def add_parser(sub) -> argparse.ArgumentParser:
    from posenc.lab.bench import PRESETS

    p = sub.add_parser("bench", help="train short, test long: every scheme and method under one protocol")
    p.add_argument("--preset", default="quick", choices=sorted(PRESETS))
    p.add_argument("--out", required=True, help="folder for results.json, report.md/html and PNGs")
    p.add_argument("--runs-dir", default=None, help="checkpoint folder (default OUT/runs)")
    p.add_argument("--corpus", default=None, help="corpus name or path (default: the preset's)")
    add_device(p)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the preset's)")
    add_quiet(p, "no progress lines")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from posenc.lab.bench import run_bench

    run_bench(args.preset, args.out, progress=not args.quiet, corpus=args.corpus, device=args.device,
              runs_dir=args.runs_dir, threads=args.threads)
    return 0
