"""The marked result blocks of the hand-written pages, re-rendered from the committed runs in one step.

A results page is prose around tables the code renders: between ``<!-- suite:NAME:begin -->`` and its end mark the
suite run ``NAME`` (:func:`posenc.evals.report.suite.readme_block`), between ``<!-- suite-summary:NAME:begin -->``
its one-table summary (:func:`~posenc.evals.report.suite.summary_block`), between
``<!-- side-by-side:A,B:begin -->`` two runs side by side (:func:`posenc.evals.report.side_by_side.block`). When a
run gains cells, every block that reads it is rewritten here, the prose left as it is; ``tests/repo/
test_suite_readme.py`` fails while a committed block differs from its rendering. The command line:
``python -m benchmarks.docs_pages blocks [--check]``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["PAGES", "render", "stale", "write"]

#: the files holding marked blocks, relative to the repository root
PAGES = (Path("README.md"), Path("docs/results/smollm2.md"), Path("docs/results/gemma3.md"))
RESULTS = Path("benchmarks/results")
_BLOCK = re.compile(r"<!-- (suite|suite-summary|side-by-side):([\w,-]+):begin -->.*?<!-- \1:\2:end -->", re.S)


def _results(root: Path, name: str) -> dict:
    path = root / RESULTS / name / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"a marked block reads {path}, which does not exist")
    return json.loads(path.read_text(encoding="utf-8"))


def _render(root: Path, kind: str, names: str) -> str:
    from posenc.evals.report import side_by_side, suite

    if kind == "suite":
        return suite.readme_block(_results(root, names), names)
    if kind == "suite-summary":
        return suite.summary_block(_results(root, names), names)
    runs = names.split(",")
    return side_by_side.block([_results(root, r) for r in runs], runs)


def render(root, text: str) -> str:
    """``text`` with each marked block replaced by its rendering from the committed results under ``root``."""
    root = Path(root)
    return _BLOCK.sub(lambda m: _render(root, m.group(1), m.group(2)), text)


def stale(root) -> list[str]:
    """The pages whose committed blocks differ from what the committed results render now."""
    root = Path(root)
    return [str(p) for p in PAGES if (root / p).is_file()
            and render(root, (root / p).read_text(encoding="utf-8")) != (root / p).read_text(encoding="utf-8")]


def write(root) -> list[Path]:
    """Rewrite the blocks of every page that is stale (atomically; the others are left untouched)."""
    from posenc.runtime.atomic import atomic_write_text

    root = Path(root)
    written = []
    for p in PAGES:
        path = root / p
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = render(root, text)
        if new != text:
            atomic_write_text(path, new)
            written.append(path)
    return written
