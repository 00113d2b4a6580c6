"""posenc.evals.report.choose: the committed "which method for my model" page is what the committed results render
now, and it carries n, intervals and the caveats."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from benchmarks import docs_pages
from posenc.evals.report import choose

ROOT = Path(__file__).resolve().parents[3]


def test_the_committed_page_is_current():
    assert (ROOT / choose.PAGE).read_text() == choose.page(ROOT), \
        "docs/results/which-method.md is stale: run python -m benchmarks.docs_pages which-method"


def test_every_real_model_row_has_its_verdict_n_and_intervals():
    from posenc.evals.report.suite import verdict

    text = choose.page(ROOT)
    res = json.loads((ROOT / "benchmarks/results" / choose.RUNS["real"] / "results.json").read_text())
    for method in {r["method"] for r in res["records"]}:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{method}` |"))
        v = verdict(res, method)
        assert v in row or v == "untouched", (method, row)
        assert re.search(r"\d+/\d+ \(\d\.\d\d \[\d\.\d\d, \d\.\d\d\]\)", row), row  # k/n (value [lo, hi])
    sections = text.split("### ")
    extends = next(s for s in sections if s.startswith("Try first"))
    assert "`selfextend` | extends" in extends and "`pi` |" not in extends


def test_the_paired_comparisons_and_the_caveats_are_there():
    text = choose.page(ROOT)
    assert "Newcombe" in text and "minus `selfextend`" in text
    assert "+0.25 [-0.05, +0.50]" in text  # retrieval minus dca: not separated, shown with its interval
    caveats = text.split("## Caveats")[1]
    for word in ("One model", "Few keys per cell", "Parameters", "Small trained models"):
        assert word in caveats
    assert text.startswith("<!-- source: ") and "<!-- end source -->" in text


def test_check_finds_a_stale_page(tmp_path, capsys):
    for run in choose.RUNS.values():
        shutil.copytree(ROOT / "benchmarks/results" / run, tmp_path / "benchmarks/results" / run,
                        ignore=shutil.ignore_patterns("*.png", "*.html", "cells"))
    (tmp_path / "docs/results").mkdir(parents=True)
    assert docs_pages.main(["which-method", "--root", str(tmp_path), "--check"]) == 1
    assert docs_pages.main(["which-method", "--root", str(tmp_path)]) == 0
    assert docs_pages.main(["which-method", "--root", str(tmp_path), "--check"]) == 0
    page = tmp_path / choose.PAGE
    page.write_text(page.read_text().replace("extends to 16k", "extends to 32k", 1))
    assert docs_pages.main(["which-method", "--root", str(tmp_path), "--check"]) == 1
    assert "stale: docs/results/which-method.md" in capsys.readouterr().err


def test_a_run_judged_by_the_interval_rule_gives_each_row_its_stored_verdict_and_its_own_paired_tables(monkeypatch):
    """On a run judged by the interval rule (Gemma 3's, committed) the page groups the rows by their stored verdicts
    (undecided among them), gives keys with Wilson intervals and perplexity ratios with theirs at every length past
    L, and takes the paired differences from the run itself, one table per length."""
    from posenc.evals.report.suite_answer import verdict_text

    monkeypatch.setitem(choose.RUNS, "real", "suite-gemma3")
    res = json.loads((ROOT / "benchmarks/results/suite-gemma3/results.json").read_text())
    text = choose.page(ROOT)
    assert text.startswith("<!-- source: benchmarks/results/suite-gemma3/results.json -->")
    real = text.split("## A pretrained RoPE model")[1].split("### Is one of them better?")[0]
    groups = {s.split("\n", 1)[0]: s for s in real.split("### ")[1:]}
    title = {"extends": "Try first", "undecided": "Undecided", "keeps perplexity only": "These keep",
             "neither": "These do neither"}
    for method, v in res["verdicts"].items():
        row = next(line for line in real.splitlines() if line.startswith(f"| `{method}` |"))
        assert re.search(r"\d+/12 \(\d\.\d\d \[\d\.\d\d, \d\.\d\d\]\) \|", row), row
        assert re.search(r"\| \d\.\d\d \[\d\.\d\d, \d\.\d\d\] \|", row), row  # a ratio and its interval
        if method == res["reference"]["method"]:
            continue
        assert f"| {verdict_text(v)}" in row, (method, row)
        group = next(g for g in choose.INTERVAL_GROUPS if v["verdict"].startswith(g))
        (heading,) = [h for h, s in groups.items() if f"| `{method}` |" in s]
        assert heading.startswith(title[group]), (method, heading)
    assert len([h for h in groups if h.startswith("Undecided")]) == 1
    assert "Paired comparisons at 64k" in text and "Paired comparisons at 128k" in text
    assert "minus `selfextend`" in text and "paired16k" not in text
    # the one difference separated at 64k, as the run stores it, and what the page says of it
    sep = next(c for c in res["comparisons"] if c["length"] == 65536 and c["method"] == "selfextend"
               and c["versus"] == "none")
    assert f"{sep['value']:+.2f} [{sep['lo']:+.2f}, {sep['hi']:+.2f}]" in text and sep["lo"] > 0
    assert "`selfextend` above `none`" in text
    assert "12 labelled keys per length" in text.split("## Caveats")[1]
