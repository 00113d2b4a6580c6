"""``posenc compat [FAMILY ...]``: which transformers model families :func:`posenc.hf.extend` works on, checked on
tiny random models built from each family's config class (:func:`posenc.hf.compat.scan`). Prints the summary line;
``--out DIR`` writes ``DIR/hf_compat.md`` (the table) and ``DIR/hf_compat.json`` (the rows)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.cli._common import add_out, add_seed, deprecated, merge_old, subparser, warn


def add_parser(sub) -> None:
    p = subparser(sub, "compat", "check posenc.hf.extend on every transformers RoPE model family (tiny models)",
                  "Build every transformers family that has a rotary embedding and a *ForCausalLM class as a tiny "
                  "random model and check posenc.hf.extend on it (unchanged logits under 'none', cached = uncached "
                  "generation under rerope). Prints the summary; --out DIR writes hf_compat.md and hf_compat.json.")
    p.add_argument("families", nargs="*", metavar="FAMILY", help="transformers families to check, e.g. llama gemma3 "
                   "(default: every family with a rotary embedding and a *ForCausalLM)")
    add_out(p, "folder for hf_compat.md (the table) and hf_compat.json (the rows)")
    add_seed(p, 0, help="seed of the tiny models' weights and inputs")
    deprecated(p, "--families", dest="old_families", use="give the families as positional arguments")
    deprecated(p, "--json", dest="old_json", use="use --out DIR (it writes DIR/hf_compat.json)")
    deprecated(p, "--no-progress", dest="old_no_progress", nargs=0, use="use --quiet")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posenc.hf.compat import scan, summary, write_json, write_table

    families = list(args.families) or None  # None: every family
    if families and not all(f.strip() for f in families):  # `posenc compat ""` is not "every family" either
        raise ValueError(f"each FAMILY must name a transformers family (e.g. llama gemma3), got {families!r}; give "
                         f"no FAMILY to check every family")
    if args.old_families is not None:
        if families:
            raise ValueError("give the families as positional arguments or the old --families, not both")
        families = [f.strip() for f in args.old_families.split(",") if f.strip()]
        if not families:
            raise ValueError(f"--families must name at least one transformers family (e.g. llama,gemma3), got "
                             f"{args.old_families!r}; leave --families out to check every family")
    merge_old(args, "old_no_progress", "quiet", "--quiet", "--no-progress")
    table = rows_json = None
    if args.out and Path(args.out).suffix == ".md":  # the old spelling: --out FILE.md
        warn(f"--out {args.out}: --out is a folder now; a .md file is deprecated and will be removed in the next "
             f"release (--out DIR writes DIR/hf_compat.md and DIR/hf_compat.json)")
        table = Path(args.out)
    elif args.out:
        table, rows_json = Path(args.out) / "hf_compat.md", Path(args.out) / "hf_compat.json"
    rows = scan(families, progress=not args.quiet, seed=args.seed)
    if table is not None:
        write_table(rows, table)
    for path in (rows_json, args.old_json):
        if path:
            write_json(rows, path)
    print(json.dumps(summary(rows)))
    return 0
