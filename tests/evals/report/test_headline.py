"""posenc.evals.report.headline: the report answers first: the headline figure and verdicts, seeds pooled in its
tables and retrieval cells, a fine-tune judged at its own trained length, the committed quick run re-rendered."""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

import pytest

from posenc.evals.records import RetrievalRecord
from posenc.evals.report import lab as R
from posenc.evals.report.doc import check_items
from posenc.evals.report.headline import baseline_checks, headline, headline_markdown
from posenc.evals.report.retrieval import ppl_vs_retrieval_table
from posenc.evals.stats.intervals import wilson
from posenc.evals.stats.verdict import EXTENDS, FAILS, LOCAL

L = 64

ROOT = Path(__file__).resolve().parents[3]


def ret(method, n, d, acc, scheme="rope", task="recall", n_trials=16, seed=None):
    r = RetrievalRecord(task, scheme, method, L, n, d, acc, n_trials, 1 / 32).to_dict()
    return r if seed is None else {**r, "seed": seed}


def rec(method, n, ppl, scheme="rope", seed=None, status="ok"):
    r = {"scheme": scheme, "method": method, "train_len": L, "eval_len": n, "ppl": ppl, "loss": math.log(ppl),
         "accuracy": 0.4, "tokens": 100, "passkey": None, "status": status, "note": ""}
    return r if seed is None else {**r, "seed": seed}


def paper_run(task="recall"):
    """The committed quick run's shape: plain RoPE copies far needles (0.91) at a 2.6x perplexity ratio; YaRN keeps
    both; a sliding window keeps perplexity and loses far needles."""
    records, retrieval = [], []
    for m, p4, far in (("none", 20.0, 0.9375), ("yarn", 8.84, 1.0), ("sliding_window", 7.17, 0.0)):
        records += [rec(m, L, 7.69), rec(m, 4 * L, p4)]
        for n in (L, 4 * L):
            for d in (8, 32, 96, 192):
                if d < n:
                    retrieval.append(ret(m, n, d, far if d > L else 1.0, task=task))
    return records, retrieval


def test_rope_at_2_6x_does_not_use_the_long_context():
    records, retrieval = paper_run()
    table = ppl_vs_retrieval_table(records, retrieval)
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| rope")}
    assert "2.60" in rows["rope"] and "uses the long context" not in rows["rope"]
    assert "fails: perplexity x2.60, though far needles are still found" in rows["rope"]
    assert "uses the long context" in rows["rope+yarn"] and "local only" in rows["rope+sliding_window"]
    _, n, hl = headline(records, retrieval)
    verdicts = {r.label: r.verdict for r in hl}
    assert n == 4 * L and verdicts == {"rope": FAILS, "rope+yarn": EXTENDS, "rope+sliding_window": LOCAL}
    assert [r.baseline for r in hl] == [True, False, False]
    # the baseline failing past L is expected, and said so
    md = headline_markdown(records, retrieval)
    assert "rope (baseline, expected)" in md
    (line,) = baseline_checks(records, retrieval)
    assert check_items([line])[0] == ("expected", line.replace("PASS", "as expected", 1))
    assert "expected fails" in line and "observed fails" in line


def test_headline_task_prefers_kv_recall_and_names_the_copy_control():
    for task in ("kv_recall", "offset"):
        RetrievalRecord(task, "rope", "none", L, 4 * L, 96, 0.5, 16, 0.1)  # accepted task names
    records, recall = paper_run("recall")
    md = headline_markdown(records, recall)
    assert "content-copy control" in md and "(recall)" in md
    _, kv = paper_run("kv_recall")
    task, _, _ = headline(records, recall + [dict(r, accuracy=0.0) for r in kv])
    assert task == "kv_recall"
    assert "content-copy" not in headline_markdown(records, kv).split("\n")[0]


# ------------------------------------------------------------------------------------------ documents
def test_bench_report_answers_first(tmp_path):
    records, retrieval = paper_run()
    meta = {"preset": "hand", "machine": {"cpu_count": 2}, "timings": {"total": 1.5}}
    paths = R.write_report({"meta": meta, "records": records, "retrieval": retrieval}, tmp_path)
    assert paths["headline_plot"].name == "headline.png" and paths["headline_plot"].stat().st_size > 10_000
    md, html = paths["markdown"].read_text(), paths["html"].read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images[0] == "headline.png" and len(images) >= 3
    assert md.index("## Which methods extend") < md.index("headline.png") < md.index("## Perplexity / accuracy")
    assert re.search(r"<img alt='([^']*)'", html).group(1).startswith("headline")
    assert html.index("<img") < html.index("Perplexity / accuracy vs evaluation length")
    for doc in (md, html):
        assert "<details><summary>machine and timings (JSON)</summary>" in doc and "</details>" in doc
        assert doc.index("<details>") > doc.index("Which methods extend")  # machine JSON is not on top
        assert "&quot;" not in doc.split("<details>")[1] or doc is html
    assert "class='fail'" not in html and "as expected: " in html and "class='expected'" in html
    assert "local only" in md.split("## Perplexity")[0] and "rope+sliding_window" in md.split("## Perplexity")[0]


def test_committed_quick_run_re_renders_with_rope_losing_far_needles(tmp_path):
    """The committed quick run (kv_recall): at 4L plain RoPE keeps perplexity on the same targets (1.30x) but loses
    the keys 192 back (0.31), so it is "local only" with the windows; YaRN extends; PI fails on perplexity."""
    src = ROOT / "benchmarks/results/bench-quick"
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()}
    assert R.main([str(src / "results.json"), str(tmp_path)]) == 0
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()} == before
    md = (tmp_path / "report.md").read_text()
    top = md.split("## Perplexity / accuracy")[0]
    local = top.split("**local only**")[1].split("\n")[0]
    assert "rope," in local and "rope+sliding_window" in local
    assert "rope+pi" in top.split("**fails**")[1].split("\n")[0]
    assert "rope+yarn" in top.split("**extends**")[1].split("\n")[0]
    assert (tmp_path / "headline.png").stat().st_size > 10_000


def test_a_fine_tune_is_judged_at_its_own_trained_length():
    """The probe may record the base model's L for a fine-tune trained longer; the headline uses the model's own."""
    records = [dict(rec("none", n, p, scheme="rope_ft"), train_len=2 * L) for n, p in ((2 * L, 7.0), (4 * L, 9.0))]
    retrieval = [ret("none", 4 * L, d, 1.0 if d <= 2 * L else 0.0, scheme="rope_ft") for d in (96, 192)]
    _, _, (row,) = headline(records, retrieval)
    assert row.train_len == 2 * L and row.far == wilson(0, 16)  # d = 96 is within the fine-tune's 128 positions
    assert row.ratio.value == pytest.approx(9.0 / 7.0) and row.verdict == LOCAL


def test_tables_and_retrieval_cells_pool_seeds():
    from posenc.evals.report.retrieval import cells

    records = [rec("none", n, p * (1 + s), seed=s) for s in (0, 1) for n, p in ((L, 7.0), (8 * L, 14.0))]
    (row,) = R.rows(records).values()
    assert row[L]["ppl"] == pytest.approx(math.sqrt(7.0 * 14.0)) and row[L]["seeds"] == 2
    assert R.shape_checks(records)[1].startswith("PASS: plain RoPE degrades beyond L: PPL(8L)/PPL(L) = 2.00")
    retrieval = [ret("none", 4 * L, 96, acc, seed=s) for s, acc in ((0, 1.0), (1, 0.25))]
    (one,) = cells(retrieval)[("rope", "none")].values()
    assert one["n"] == 32 and one["accuracy"] == pytest.approx(20 / 32)
