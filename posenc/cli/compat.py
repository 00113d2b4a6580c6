"""``posenc compat``: which transformers model families :func:`posenc.hf.extend` works on, checked on tiny
random models built from each family's config class (:func:`posenc.hf.compat.scan`). Prints the summary
line; ``--out`` writes the Markdown table, ``--json`` the rows."""

from __future__ import annotations

import argparse
import json


def add_parser(sub) -> None:
    p = sub.add_parser("compat", help="check posenc.hf.extend on every transformers RoPE model family (tiny models)")
    p.add_argument("--families", default=None, help="comma-separated transformers families (default: every one "
                   "with a rotary embedding and a *ForCausalLM), e.g. llama,gemma3")
    p.add_argument("--out", default=None, help="Markdown report, e.g. benchmarks/results/hf_compat.md")
    p.add_argument("--json", default=None, help="rows and summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.hf.compat import scan, summary, write_json, write_table

    families = None  # every family
    if args.families is not None:
        families = [f.strip() for f in args.families.split(",") if f.strip()]
        if not families:
            raise ValueError(f"--families must name at least one transformers family (e.g. llama,gemma3), got "
                             f"{args.families!r}; leave --families out to check every family")
    rows = scan(families, progress=not args.no_progress)
    if args.out:
        write_table(rows, args.out)
    if args.json:
        write_json(rows, args.json)
    print(json.dumps(summary(rows)))
    return 0
