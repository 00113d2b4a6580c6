"""posenc.evals.report.retrieval: the report's retrieval half (table, verdicts, checks, plot)."""

from __future__ import annotations

from posenc.evals.records import RetrievalRecord
from posenc.evals.report.retrieval import cells, plot_retrieval, ppl_vs_retrieval_table, retrieval_checks
from posenc.tasks.recall import probe_distances


def _rec(method, n, d, acc, scheme="rope"):
    return RetrievalRecord("recall", scheme, method, 64, n, d, acc, 32, 1 / 32).to_dict()


def _fake():
    retrieval, records = [], []
    for n in (64, 256):
        for d in probe_distances(64, n):
            far = d > 64
            retrieval += [_rec("none", n, d, 0.95 if n == 64 else 0.1),
                          _rec("sliding_window", n, d, 0.02 if far else 0.9),
                          _rec("yarn", n, d, 0.85)]
        records += [{"scheme": "rope", "method": m, "train_len": 64, "eval_len": n, "ppl": p, "status": "ok"}
                    for m, p in (("none", 7.0 if n == 64 else 11.0), ("sliding_window", 7.0), ("yarn", 7.5))]
    return records, retrieval


def test_report_headline_table_verdicts_and_checks(tmp_path):
    records, retrieval = _fake()
    table = ppl_vs_retrieval_table(records, retrieval)
    lines = {row.split("|")[1].strip(): row for row in table.splitlines() if row.startswith("| rope")}
    assert "local only: keeps perplexity, loses far needles" in lines["rope+sliding_window"]
    assert "uses the long context" in lines["rope+yarn"]
    assert "fails" in lines["rope"]
    # far needles found but perplexity 11/7 = 1.57x at 4L: not "uses the long context" (plain RoPE's 2.61x in quick)
    degraded = [dict(r, accuracy=0.9) if r["method"] == "none" else r for r in retrieval]
    row = next(r for r in ppl_vs_retrieval_table(records, degraded).splitlines() if r.startswith("| rope |"))
    assert "fails: perplexity x1.57, though far needles are still found" in row and "uses the long context" not in row
    checks = retrieval_checks(retrieval)
    assert [c.split(":")[0] for c in checks] == ["PASS"] * 4, checks
    bad = [dict(r, accuracy=0.5) if r["method"] == "sliding_window" and r["distance"] > 64 else r for r in retrieval]
    assert any(c.startswith("FAIL: sliding_window") for c in retrieval_checks(bad))
    assert set(cells(retrieval)) == {("rope", "none"), ("rope", "sliding_window"), ("rope", "yarn")}
    png = plot_retrieval(retrieval, tmp_path / "r.png")
    assert png.stat().st_size > 5000
    assert plot_retrieval([], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
