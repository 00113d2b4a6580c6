"""benchmarks/tune_heldout.py on a tiny tune: its top candidates are re-scored on the held-out default contexts (not
the tune's own), both rankings are written, and a rerun reads the cells instead of recomputing."""

from __future__ import annotations

import json

from tests.evals.tune.test_search import tiny  # noqa: F401 - fixture


def test_a_tune_is_rescored_on_the_held_out_contexts(tiny, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    from benchmarks import tune_heldout
    from posenc.evals.tune import objective

    tune = tmp_path / "tune"
    tune.mkdir()
    rows = [{"method": "yarn", "params": {"factor": 2.0}, "score": 5.0, "retrieval": 1.0, "ppl": 90.0},
            {"method": "none", "params": {}, "score": 9.0, "retrieval": 0.0, "ppl": 900.0},
            {"method": "pi", "params": {"factor": 2.0}, "score": 6.0, "retrieval": 0.5, "ppl": 200.0}]
    meta = {"model": str(tiny), "model_id": "tiny", "length": 512, "target_tokens": 32, "weight": 1.0,
            "contexts": [["book", "passkey", 0], ["noise", "passkey", 0]]}
    (tune / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    seen = []
    real = objective.TuneObjective._context
    monkeypatch.setattr(objective.TuneObjective, "_context", lambda self, *c: seen.append(c) or real(self, *c))
    assert tune_heldout.main(["--tune", str(tune), "--top", "2", "--out", str(tmp_path / "out")]) == 0
    got = json.loads((tmp_path / "out" / "tune_heldout_512.json").read_text())
    assert [c["method"] for c in got["candidates"]] == ["yarn", "pi"]  # the top 2 by the tune's score
    assert sorted(c["heldout_rank"] for c in got["candidates"]) == [1, 2]
    assert set(seen) == {tuple(c) for c in objective.DEFAULT_CONTEXTS} and ("book", "passkey", 0) not in seen
    assert got["heldout_winner"]["heldout_rank"] == 1
    seen.clear()
    assert tune_heldout.main(["--tune", str(tune), "--top", "2", "--out", str(tmp_path / "out")]) == 0
    assert seen == []  # every prefill read back from the cells
