"""The real-model results page's tables (docs/results/smollm2.md, moved there from the README) are the committed
suite results, rendered (no number typed by hand), and the README's summary of the full run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posenc.evals.report.suite import README_MARKS, readme_block

ROOT = Path(__file__).resolve().parents[2]

PAGES = {name: (ROOT / "docs" / "results" / name).read_text(encoding="utf-8") for name in ("smollm2.md", "gemma3.md")}

RUNS = sorted((page, run) for page, text in PAGES.items()
              for run in set(re.findall(r"<!-- suite:([\w-]+):begin -->", text)))


def test_the_results_page_holds_the_short_real_model_run():
    assert ("smollm2.md", "suite-smollm2") in RUNS


def _marked(text: str, marks: tuple[str, str], name: str) -> str:
    begin, end = (m.format(name=name) for m in marks)
    return text[text.index(begin):text.index(end) + len(end)]


def _results(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / "results" / name / "results.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("page,name", RUNS)
def test_readme_tables_equal_the_committed_results(page, name):
    assert _marked(PAGES[page], README_MARKS, name) == readme_block(_results(name), name)


SIDE_BY_SIDE = sorted((page, names) for page, text in PAGES.items()
                      for names in set(re.findall(r"<!-- side-by-side:([\w,-]+):begin -->", text)))


def test_the_gemma3_page_sets_its_run_beside_smollm2s():
    assert ("gemma3.md", "suite-gemma3,suite-smollm2-full") in SIDE_BY_SIDE


@pytest.mark.parametrize("page,names", SIDE_BY_SIDE)
def test_side_by_side_tables_equal_the_committed_results(page, names):
    from posenc.evals.report.side_by_side import MARKS, block

    runs = names.split(",")
    begin, end = (m.format(names=names) for m in MARKS)
    text = PAGES[page]
    assert text[text.index(begin):text.index(end) + len(end)] == block([_results(r) for r in runs], runs)


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


def test_the_committed_short_run_has_two_dozen_keys_per_cell_and_four_passages():
    """The short preset's committed run (``--preset smollm2``, several keys per prefill): the untouched model at 8k
    (the reference) and 16k, SelfExtend and YaRN at 16k each hold at least 24 keys with a Wilson interval, keys by
    distance bin, and perplexity on 4 passages with paired ratios to the untouched model at L; it is complete and
    judged by the interval rule."""
    res = _results("suite-smollm2-keys")
    assert res["meta"]["complete"] is True and res["meta"]["missing"] == {}
    assert res["reference"]["rule"] == "interval" and res["reference"]["interval"]["n"] >= 24
    rows = {(r["method"], r["eval_len"]): r for r in res["records"]}
    for key in (("none", 8192), ("none", 16384), ("selfextend", 16384), ("yarn", 16384)):
        r = rows[key]
        iv = r["retrieval"]
        assert iv["n"] >= 24 and iv["lo"] <= iv["value"] <= iv["hi"], key
        assert sum(b["interval"]["n"] for b in r["by_bin"]) == iv["n"], key
        assert len(r["passages"]) == 4 and r["ppl_ratio"]["n"] == 4 and r["ppl_ratio"]["lo"] is not None, key


def test_the_committed_gemma3_run_is_whole_every_row_holding_a_dozen_keys_and_both_passages():
    """``suite-gemma3`` is finished: every (row, length) of the preset is a record, but a row left out at 128k (named
    in ``meta.left_out``, with its reason), and each holds 12 keys with a Wilson interval, by distance bin, and the
    same 2 passages, paired against the untouched model at 32k."""
    res = _results("suite-gemma3")
    meta = res["meta"]
    assert meta["complete"] is True and meta["missing"] == {}
    assert res["reference"]["interval"]["n"] == 12
    assert meta["left_out"] and all(k.endswith("@131072") and why for k, why in meta["left_out"].items())
    grid = {f"{m}@{n}" for m in meta["config"]["methods"] for n in meta["config"]["lengths"]}
    assert {f"{r['method']}@{r['eval_len']}" for r in res["records"]} == grid - set(meta["left_out"])
    for r in res["records"]:
        key, iv = (r["method"], r["eval_len"]), r["retrieval"]
        assert iv["n"] == 12 and iv["lo"] <= iv["value"] <= iv["hi"], key
        assert sum(b["interval"]["n"] for b in r["by_bin"]) == 12, key
        assert sorted(r["passages"]) == ["book:niah/0", "book:niah/1"] and r["ppl_ratio"]["n"] == 2, key
