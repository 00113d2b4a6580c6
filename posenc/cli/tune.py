"""``posenc tune MODEL --length N --out DIR``: search the length extension of a model (a Hugging Face folder, a
``.gguf`` file, a run folder of ``posenc train`` or ``smollm2``) on the long-context suite's objective within a
budget of forward passes, print the ranked table and the recommendation, and save the winner
(:func:`posenc.evals.tune.tune`). Re-running the same command resumes: finished cells in ``DIR/cells`` are read back,
not recomputed."""

from __future__ import annotations

import argparse

from posenc.cli._common import add_device, add_dtype, add_out, add_seed, device_dtype, subparser


def _context(s: str) -> tuple[str, str, int]:
    from posenc.tasks.haystack import HAYSTACKS

    parts = s.split(":")
    hay = parts.pop(0) if len(parts) > 1 and parts[0] in HAYSTACKS else "book"
    if len(parts) > 2 or not parts[0]:
        raise argparse.ArgumentTypeError(f"--context expects [HAYSTACK:]GENERATORS[:SEED] (e.g. noise:passkey:0), "
                                         f"got {s!r}")
    try:
        return hay, parts[0], int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"--context expects [HAYSTACK:]GENERATORS[:SEED] (e.g. noise:passkey:0), "
                                         f"got {s!r}") from None


def add_parser(sub) -> None:
    from posenc.evals.tune.search import DEFAULT_METHODS

    p = subparser(sub, "tune", "search the extension (method, parameters, LongRoPE factors) of a model for a target "
                  "length and save the winner (resumable)")
    p.add_argument("model", metavar="MODEL",
                   help="the model: a Hugging Face folder, a .gguf file, a run folder of posenc train, or a bundled "
                        "model (smollm2, gemma3-270m)")
    p.add_argument("--length", type=int, required=True, metavar="N",
                   help="the target context length in tokens (required, no default)")
    add_out(p, "output folder (cells, results.json, report.md, the saved model): a new or empty folder, or the "
               "folder of an earlier tune of the same MODEL and --length, which is resumed (its finished cells read "
               "back) and whose results and winner are then replaced; a folder holding anything else (another "
               "command's results, another tune's, other files) is refused", required=True)
    p.add_argument("--budget", type=int, default=40, metavar="N",
                   help="forward passes (one prefill of one context each)")
    p.add_argument("--search", action="append", default=None, metavar="SPEC",
                   help=f"a method to search, repeatable (default: {' '.join(DEFAULT_METHODS)})")
    p.add_argument("--no-longrope", dest="longrope", action="store_false",
                   help="skip LongRoPE's per-dimension factor search (default: searched)")
    p.add_argument("--context", action="append", type=_context, default=None, metavar="[HAYSTACK:]GENERATORS[:SEED]",
                   help="a tune context, repeatable: a book haystack (the default; its target passage is the loss), "
                        "book_heldout (other books than the suite's) or noise haystack with these needles, e.g. "
                        "passkey:0, noise:passkey:1, niah:1 (default, held out from every suite context: "
                        "book_heldout:passkey:0 noise:passkey:1000)")
    p.add_argument("--target", type=int, default=256, metavar="N", help="scored target-passage tokens per context")
    p.add_argument("--weight", type=float, default=1.0, metavar="X", help="score = loss + X x (1 - retrieval)")
    add_device(p)
    add_dtype(p)
    add_seed(p, 0, help="seed of the evolutionary search")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from posenc._util import check_positive_int
    from posenc.evals.results_folder import check_results_folder
    from posenc.evals.tune.search import DEFAULT_METHODS, tune

    check_results_folder(args.out, "tune", what="--out")  # before anything is loaded or written
    for flag in ("length", "budget", "target"):
        check_positive_int(f"--{flag}", getattr(args, flag))
    device, dtype = device_dtype(args)
    res = tune(args.model, args.length, args.out, budget=args.budget, methods=tuple(args.search or DEFAULT_METHODS),
               longrope=args.longrope, seed=args.seed, contexts=tuple(args.context) if args.context else None,
               target=args.target, weight=args.weight, progress=not args.quiet, device=device, dtype=dtype)
    if args.quiet:
        w = res["winner"]
        print(json.dumps({"winner": {k: w[k] for k in ("method", "score", "ppl", "retrieval")}, "saved": res["saved"]}))
    return 0
