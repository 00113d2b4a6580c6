"""The documentation pages generated from the code and the committed results, written or checked from the command
line: ``python -m benchmarks.docs_pages {atlas,which-method,blocks,all} [--root DIR] [--check]``.

- ``atlas``: ``docs/atlas.md`` and one position map per method in ``docs/atlas/`` (:mod:`posenc.analysis.atlas`);
- ``which-method``: ``docs/results/which-method.md`` from the committed verdict tables
  (:mod:`posenc.evals.report.choose`);
- ``blocks``: the marked result blocks of ``README.md``, ``docs/results/smollm2.md`` and ``docs/results/gemma3.md``
  (suite runs, summaries, runs side by side) re-rendered from the committed runs, the prose left as it is
  (:mod:`posenc.evals.report.blocks`).

``--check`` writes nothing: it prints ``stale: PATH`` for each file that differs from what would be written, and
exits 1 if any does (``tests/analysis/test_atlas.py`` and ``tests/evals/report/test_choose.py`` run the same checks).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGES = ("atlas", "which-method", "blocks")


def _module(name: str):
    if name == "atlas":
        from posenc.analysis import atlas

        return atlas
    if name == "blocks":
        from posenc.evals.report import blocks

        return blocks
    from posenc.evals.report import choose

    return choose


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.docs_pages", description=__doc__.split("\n\n")[0])
    ap.add_argument("page", choices=(*PAGES, "all"), help="the page to write or check")
    ap.add_argument("--root", default=".", help="the repository root (default: .)")
    ap.add_argument("--check", action="store_true", help="compare the committed files instead of writing them")
    args = ap.parse_args(argv)
    root = Path(args.root)
    bad = []
    for name in PAGES if args.page == "all" else (args.page,):
        module = _module(name)
        if args.check:
            bad += module.stale(root)
            continue
        written = module.write(root)
        if name == "blocks":
            print(f"blocks: rewrote {', '.join(map(str, written)) or 'nothing (every block is current)'}")
            continue
        written = written if isinstance(written, list) else [written]
        print(f"{name}: wrote {written[0]}" + (f" and {len(written) - 1} figures" if len(written) > 1 else ""))
    for path in bad:
        print(f"stale: {path}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
