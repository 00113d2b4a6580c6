"""``posenc bench``: train short, test long (:func:`posenc.evals.lab.bench.run_bench`), or run the long-context suite
on a pretrained model (:func:`posenc.evals.suite.run_suite`) with a real-model preset."""

from __future__ import annotations

import argparse

from posenc.cli._common import add_device, add_dtype, add_out, add_seed, device_dtype, subparser


def _suite_presets() -> dict:
    from posenc.evals.suite.presets import SUITE_PRESETS

    return SUITE_PRESETS


def add_parser(sub) -> argparse.ArgumentParser:
    from posenc.evals.lab.bench import PRESETS

    p = subparser(sub, "bench", "train short, test long: every scheme and method under one protocol; or, with a "
                  "real-model preset (smollm2, smollm2_full, gemma3), the long-context suite on a pretrained model")
    names = sorted(PRESETS) + sorted(_suite_presets())
    p.add_argument("--preset", default=None, choices=names, metavar="PRESET",
                   help="lab preset (trains small models: " + ", ".join(sorted(PRESETS)) + ") or real-model suite "
                   "preset (" + ", ".join(sorted(_suite_presets())) + "); default: quick, or model with --model (the "
                   "suite at L/2, L, 2L, 4L of the model's trained length L)")
    add_out(p, "folder for results.json, report.md/html and the PNGs: a new or empty folder, or the folder of an "
               "earlier run of the same preset (and model), which is resumed (finished cells and checkpoints are "
               "read back) and whose results and report are then rewritten; a folder holding anything else "
               "(another command's results, another preset's, other files) is refused", required=True)
    p.add_argument("--model", default=None, metavar="MODEL", help="real-model presets: the model to run them on, a "
                   "Hugging Face folder or a .gguf file (default: the preset's, SmolLM2-135M)")
    p.add_argument("--lengths", default=None, metavar="N,N,...", help="real-model presets: the context lengths in "
                   "tokens instead of the preset's (the model's trained length is added: the untouched model there "
                   "is the reference)")
    p.add_argument("--runs-dir", default=None, metavar="DIR", help="checkpoint folder (default: OUT/runs)")
    p.add_argument("--corpus", default=None, metavar="NAME", help="corpus name or path (default: the preset's)")
    add_device(p)
    add_dtype(p)
    add_seed(p, None, help="seed of training and probes (default: the preset's)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch threads (default: the preset's)")
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="lab presets: models trained and evaluated at "
                   "once, each in its own process with --threads threads (default: the preset's); results do not "
                   "depend on it")
    p.add_argument("--cells", default=None, metavar="DIR", help="real-model presets: keep the cells in DIR instead of "
                   "OUT/cells, e.g. another run's cells folder, whose finished cells are then read, not recomputed "
                   "(a cell's key does not name the preset)")
    p.add_argument("--report-only", action="store_true", help="real-model presets: run no cell; write results.json "
                   "and the report of the cells finished so far, saying which are not run yet (a run completed over "
                   "several sittings)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS", help="real-model presets: run "
                   "each cell as a task on a Ray cluster (pip install 'posenc[ray]'), one cell per GPU with --device "
                   "cuda: no ADDRESS starts a local cluster, 'auto' joins the one started on this node, else a Ray "
                   "address; the cells folder and the model must be on storage every node sees; the results equal "
                   "a run without it (default: no Ray, the cells one after the other in this process)")
    p.set_defaults(func=run)
    return p


def _run_suite(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from posenc.evals.suite import run_suite

    preset = _suite_presets()[args.preset]
    if args.model:
        preset = replace(preset, model=args.model)
    if args.threads:
        preset = replace(preset, threads=args.threads)
    for flag in ("runs_dir", "corpus", "seed", "jobs"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')} is for the lab presets; {args.preset!r} evaluates a "
                             "pretrained model (its contexts have their own seeds)")
    device, dtype = device_dtype(args)  # a device this machine lacks: one line naming --device
    if args.ray is not None:
        _check_ray(args)
    # SIGINT/SIGTERM: run_suite stops with posenc.runtime.interrupt.Interrupted naming the cells folder, which
    # posenc.cli.main prints on stderr (exit status 130/143)
    results = run_suite(preset, args.out, cells_dir=args.cells, progress=not args.quiet,
                        report_only=args.report_only, device=device, dtype=dtype,
                        dispatch=None if args.ray is None else "ray", ray_address=args.ray,
                        lengths=_lengths(args.lengths))
    missing = sum(results["meta"]["missing"].values())
    print(f"report: {args.out}/report.md ({results['meta']['cells']} cells"
          + (f"; {missing} not run yet: run without --report-only to continue)" if missing else ")"))
    return 0


def _lengths(text: str | None) -> tuple[int, ...] | None:
    """``--lengths 4096,8192``: positive token counts; one line naming the flag otherwise."""
    if text is None:
        return None
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        out = ()
    if not out or min(out) < 1:
        raise ValueError(f"--lengths: give positive token counts separated by commas, got {text!r}")
    return out


def _check_ray(args: argparse.Namespace) -> None:
    """``--ray``: an address, no ``--report-only``, Ray installed; each refusal one line naming the flag."""
    from posenc.evals.suite.cluster import require_ray

    if not args.ray.strip():
        raise ValueError("--ray ADDRESS: the address is empty (leave it out for a local cluster, or 'auto')")
    if args.report_only:
        raise ValueError("--ray runs cells and --report-only runs none: leave one of them out")
    require_ray("--ray")


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from posenc.evals.lab.bench import PRESETS, run_bench
    from posenc.evals.results_folder import check_results_folder

    if args.preset is None:
        args.preset = "model" if args.model else "quick"
    if args.preset in _suite_presets():
        check_results_folder(args.out, "suite", what="--out", same={"preset": args.preset})  # before any work
        return _run_suite(args)
    check_results_folder(args.out, "lab bench", what="--out", same={"preset": args.preset})
    for flag in ("model", "cells", "report_only", "lengths"):
        if getattr(args, flag):
            raise ValueError(f"--{flag.replace('_', '-')} is for the real-model presets ("
                             + ", ".join(sorted(_suite_presets())) + ")")
    if args.ray is not None:
        raise ValueError("--ray is for the real-model presets (" + ", ".join(sorted(_suite_presets())) + "); the "
                         "lab presets run on this machine, --jobs models at once")
    if args.dtype not in ("auto", "float32"):
        raise ValueError(f"--dtype {args.dtype} is for the real-model presets; the lab presets train and evaluate "
                         "in float32 (--dtype auto or float32)")
    from posenc.data.corpora import check_default_corpus

    preset = PRESETS[args.preset]
    if args.seed is not None:
        preset = replace(preset, seed=args.seed)
    if args.jobs is not None:
        preset = replace(preset, jobs=args.jobs)
    check_default_corpus(args.corpus or preset.corpus)
    run_bench(preset, args.out, progress=not args.quiet, corpus=args.corpus, device=args.device,
              runs_dir=args.runs_dir, threads=args.threads)
    return 0
