"""``posenc tune``: runs on a tiny model and prints the winner."""

from __future__ import annotations

import json

from tests.evals.tune.test_search import tiny  # noqa: F401 - fixtures

N = 512


def test_cli_tune_runs_and_prints_the_winner(tiny, tmp_path):  # noqa: F811 - the fixture
    from posenc.cli import main

    code = main(["tune", str(tiny), "--length", str(N), "--out", str(tmp_path), "--budget", "3", "--search", "yarn",
                 "--no-longrope", "--context", "passkey:0", "--target", "32", "--quiet"])
    assert code == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["budget_forwards"] == 3 and len(res["rows"]) == 3
    assert {r["method"] for r in res["rows"]} == {"none", "yarn"}
    assert main(["tune", str(tiny), "--length", str(N), "--out", str(tmp_path / "b"), "--budget", "0"]) == 2
