"""The real-model results page's tables (docs/results/smollm2.md, moved there from the README) are the committed
suite results, rendered (no number typed by hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posenc.hf.suite.report import README_MARKS, readme_block

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "results" / "smollm2.md").read_text(encoding="utf-8")
RUNS = sorted(set(re.findall(r"<!-- suite:([\w-]+):begin -->", PAGE)))


def test_the_results_page_holds_the_short_real_model_run():
    assert "suite-smollm2" in RUNS


@pytest.mark.parametrize("name", RUNS)
def test_readme_tables_equal_the_committed_results(name):
    results = json.loads((ROOT / "benchmarks" / "results" / name / "results.json").read_text(encoding="utf-8"))
    begin, end = (m.format(name=name) for m in README_MARKS)
    block = PAGE[PAGE.index(begin):PAGE.index(end) + len(end)]
    assert block == readme_block(results, name)
