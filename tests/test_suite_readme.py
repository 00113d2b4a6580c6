"""The real-model results page's tables (docs/results/smollm2.md, moved there from the README) are the committed
suite results, rendered (no number typed by hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posenc.evals.report.suite import README_MARKS, readme_block

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "results" / "smollm2.md").read_text(encoding="utf-8")
RUNS = sorted(set(re.findall(r"<!-- suite:([\w-]+):begin -->", PAGE)))


def test_the_results_page_holds_the_short_real_model_run():
    assert "suite-smollm2" in RUNS


def _marked(text: str, marks: tuple[str, str], name: str) -> str:
    begin, end = (m.format(name=name) for m in marks)
    return text[text.index(begin):text.index(end) + len(end)]


def _results(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / name / "results.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", RUNS)
def test_readme_tables_equal_the_committed_results(name):
    assert _marked(PAGE, README_MARKS, name) == readme_block(_results(name), name)


README = (ROOT / "README.md").read_text(encoding="utf-8")
SUMMARIES = sorted(set(re.findall(r"<!-- suite-summary:([\w-]+):begin -->", README)))


def test_the_readme_holds_the_full_real_model_run():
    assert "suite-smollm2-full" in SUMMARIES


def test_the_committed_full_run_is_complete():
    """Every method x length of ``smollm2_full`` is in the committed results: a row (with its cells) or a 32k row
    left out by the stated rule (retrieval at 16k below the threshold); nothing missing, no row outside the grid."""
    from posenc.evals.suite.presets import SUITE_PRESETS

    preset, res = SUITE_PRESETS["smollm2_full"], _results("suite-smollm2-full")
    meta = res["meta"]
    assert meta["complete"] is True and meta["missing"] == {} and meta["cells"] == 441
    rows = {(r["method"], r["eval_len"]) for r in res["records"]}
    left_out = {(k.rsplit("@", 1)[0], int(k.rsplit("@", 1)[1])): why for k, why in meta["left_out"].items()}
    grid = {(m, n) for m in preset.methods for n in preset.lengths}
    assert rows | left_out.keys() == grid and not rows & left_out.keys()
    assert all(n == preset.prune_from and "below" in why for (_, n), why in left_out.items())
    assert sum(r["cells"] for r in res["records"]) == meta["cells"] and min(r["cells"] for r in res["records"]) >= 3


@pytest.mark.parametrize("name", SUMMARIES)
def test_readme_summary_equals_the_committed_results(name):
    from posenc.evals.report.suite import SUMMARY_MARKS, summary_block

    assert _marked(README, SUMMARY_MARKS, name) == summary_block(_results(name), name)


def _rec(method, n, ppl, k, total=4):
    lo_hi = {"lo": 0.0, "hi": 1.0}
    return {"method": method, "eval_len": n, "ppl": ppl, "prefill_s": 10.0 * n, "peak_rss_mb": 1024.0 * n,
            "retrieval": {"k": k, "n": total, "value": k / total, **lo_hi}}


def test_verdict_follows_its_stated_rule():
    """``extends to N``: retrieval past the trained length at the threshold (0.85 x 0.75 here), even after a miss at
    a shorter length; ``keeps perplexity only``: every perplexity past it within 1.25 x the untouched model's at
    the reference length (100), a boundary case included; ``neither`` otherwise."""
    from posenc.evals.report.suite import summary_table, verdict

    recs = [_rec("none", 8, 100.0, 3), _rec("none", 16, 900.0, 0),
            _rec("a", 8, 100.0, 0), _rec("a", 16, 110.0, 3), _rec("a", 32, 5000.0, 0),  # 3/4 >= 0.6375
            _rec("b", 8, 100.0, 3), _rec("b", 16, 125.0, 2), _rec("b", 32, 120.0, 1),  # 125 = 1.25 x 100
            _rec("c", 8, 100.0, 3), _rec("c", 16, 126.0, 2),  # 126 > 125
            _rec("d", 8, 100.0, 4)]
    results = {"records": recs, "meta": {"train_len": 8},
               "reference": {"method": "none", "length": 8, "threshold": 0.85 * 0.75},
               "effective": {"a": {"effective_length": None}, "b": {"effective_length": 8}}}
    got = {m: verdict(results, m) for m in ("none", "a", "b", "c", "d")}
    assert got == {"none": "untouched", "a": "extends to 16", "b": "keeps perplexity only", "c": "neither",
                   "d": "not run past the trained length"}
    table = summary_table(results)
    assert table.header[-2:] == ("prefill s at 16 / 32", "peak RSS")
    assert table.rows[1] == ("a", "100, 0/4", "110, 3/4", "5000, 0/4", "< 8", "extends to 16", "160 / 320",
                             "32.0 GiB at 32")
