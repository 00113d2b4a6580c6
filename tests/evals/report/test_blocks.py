"""posenc.evals.report.blocks: the marked result blocks of a page re-rendered from the committed runs, the prose
around them untouched; ``python -m benchmarks.docs_pages blocks`` writes or checks them."""

from __future__ import annotations

import json

import pytest

from benchmarks.docs_pages import main as docs_pages
from posenc.evals.report import blocks
from posenc.evals.report.side_by_side import block


def _run(model, train, k):
    recs = [{"method": m, "eval_len": n, "ppl": 10.0, "retrieval": {"k": k, "n": 4, "value": k / 4, "lo": 0.1,
                                                                     "hi": 0.9}}
            for m in ("none", "yarn") for n in (train, 2 * train)]
    return {"meta": {"model": f"{model}: x", "train_len": train}, "records": recs,
            "reference": {"method": "none", "length": train, "retrieval": 0.75, "fraction": 0.85, "threshold": 0.6}}


@pytest.fixture
def root(tmp_path):
    for name, run in (("run-a", _run("a", 8, 3)), ("run-b", _run("b", 32, 1))):
        (tmp_path / "benchmarks" / "results" / name).mkdir(parents=True)
        (tmp_path / "benchmarks" / "results" / name / "results.json").write_text(json.dumps(run))
    (tmp_path / "docs" / "results").mkdir(parents=True)
    return tmp_path


def test_a_stale_block_is_rewritten_and_the_prose_around_it_kept(root):
    page = root / "docs" / "results" / "gemma3.md"
    old = "<!-- side-by-side:run-a,run-b:begin -->\n| old |\n<!-- side-by-side:run-a,run-b:end -->"
    page.write_text(f"# Title\n\nProse before.\n\n{old}\n\nProse after.\n")
    assert blocks.stale(root) == ["docs/results/gemma3.md"]
    assert docs_pages(["blocks", "--root", str(root), "--check"]) == 1
    assert blocks.write(root) == [page]
    runs = [json.loads((root / "benchmarks" / "results" / n / "results.json").read_text()) for n in ("run-a", "run-b")]
    assert page.read_text() == f"# Title\n\nProse before.\n\n{block(runs, ['run-a', 'run-b'])}\n\nProse after.\n"
    assert blocks.stale(root) == [] and blocks.write(root) == []
    assert docs_pages(["blocks", "--root", str(root), "--check"]) == 0


def test_a_block_reading_a_run_that_is_not_committed_is_refused_naming_the_file(root):
    (root / "README.md").write_text("<!-- suite-summary:run-c:begin -->\n<!-- suite-summary:run-c:end -->\n")
    with pytest.raises(FileNotFoundError, match="run-c/results.json, which does not exist"):
        blocks.stale(root)
