"""benchmarks.compare_cells: a re-run cell against the same cell at a git revision; cells not re-run are left out."""

import json
import math
import subprocess

from benchmarks.compare_cells import compare


def _cell(method, loss, answers, prefill):
    return {"key": {"method": method, "length": 16384, "haystack": "book", "generators": ["niah"], "seed": 0},
            "value": {"target": {"loss": loss}, "answers": [{"answer": a, "correct": a == "7"} for a in answers],
                      "prefill_s": prefill, "peak_rss_mb": 100.0}}


def test_compare_cells_reports_the_re_run_cells_only(tmp_path, monkeypatch):
    cells = tmp_path / "cells"
    cells.mkdir()
    (cells / "a.json").write_text(json.dumps(_cell("retrieval", 4.5, ["7", "1"], 100.0)))
    (cells / "b.json").write_text(json.dumps(_cell("retrieval", 4.0, ["7"], 50.0)))
    (cells / "c.json").write_text(json.dumps(_cell("yarn", 4.0, ["7"], 50.0)))
    monkeypatch.chdir(tmp_path)
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], check=True)
    (cells / "a.json").write_text(json.dumps(_cell("retrieval", 4.5 + 1e-7, ["7", "2"], 25.0)))  # re-run
    (cells / "c.json").write_text(json.dumps(_cell("yarn", 9.0, ["1"], 5.0)))  # another method
    res = compare("HEAD", cells.relative_to(tmp_path), [cells], "retrieval")
    assert [r["cell"] for r in res["cells"]] == ["a.json"]  # b not re-run, c another method
    r = res["cells"][0]
    assert r["prefill_speedup"] == 4.0 and not r["answers_equal"] and not res["all_answers_equal"]
    assert math.isclose(r["ppl_before"], math.exp(4.5)) and math.isclose(res["max_loss_abs_diff"], 1e-7, rel_tol=1e-3)
    assert (r["correct_before"], r["correct_after"], r["n_answers"]) == (1, 1, 2)
