"""``posenc bench``: train short, test long (:func:`posenc.lab.bench.run_bench`)."""

from __future__ import annotations

import argparse

from posenc.cli._common import add_device, add_quiet


def _suite_presets() -> dict:
    from posenc.hf.suite.presets import SUITE_PRESETS

    return SUITE_PRESETS


def add_parser(sub) -> argparse.ArgumentParser:
    from posenc.lab.bench import PRESETS

    p = sub.add_parser("bench", help="train short, test long: every scheme and method under one protocol; or, with a "
                       "real-model preset (smollm2, smollm2_full), the long-context suite on a pretrained model")
    p.add_argument("--preset", default="quick", choices=sorted(PRESETS) + sorted(_suite_presets()),
                   help="lab preset (trains small models) or real-model suite preset (default: %(default)s)")
    p.add_argument("--model", default=None, help="real-model presets: another model to run them on (a Hugging Face "
                   "folder or a .gguf file; default: the preset's, SmolLM2-135M)")
    p.add_argument("--out", required=True, help="folder for results.json, report.md/html and PNGs")
    p.add_argument("--runs-dir", default=None, help="checkpoint folder (default OUT/runs)")
    p.add_argument("--corpus", default=None, help="corpus name or path (default: the preset's)")
    add_device(p)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the preset's)")
    add_quiet(p, "no progress lines")
    p.set_defaults(func=run)
    return p


def _run_suite(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from posenc.hf.suite import run_suite

    preset = _suite_presets()[args.preset]
    if args.model:
        preset = replace(preset, model=args.model)
    if args.threads:
        preset = replace(preset, threads=args.threads)
    for flag in ("runs_dir", "corpus"):
        if getattr(args, flag):
            raise ValueError(f"--{flag.replace('_', '-')} is for the lab presets; {args.preset!r} evaluates a "
                             "pretrained model")
    try:
        results = run_suite(preset, args.out, progress=not args.quiet)
    except KeyboardInterrupt:
        print(f"posenc: interrupted; finished cells are kept in {args.out}/cells: run the same command to continue")
        return 130
    print(f"report: {args.out}/report.md ({results['meta']['cells']} cells)")
    return 0


def run(args: argparse.Namespace) -> int:
    from posenc.lab.bench import run_bench

    if args.preset in _suite_presets():
        return _run_suite(args)
    if args.model:
        raise ValueError("--model is for the real-model presets (" + ", ".join(sorted(_suite_presets())) + ")")

    run_bench(args.preset, args.out, progress=not args.quiet, corpus=args.corpus, device=args.device,
              runs_dir=args.runs_dir, threads=args.threads)
    return 0
