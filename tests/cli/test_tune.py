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


def test_cli_tune_refuses_a_file_out_and_bad_settings_in_one_line(tiny, tmp_path, capsys):  # noqa: F811
    """``tune --out afile`` ([Errno 17]), ``--target 0`` (26 prefills, then an IndexError), ``--length`` too short
    for ``--target`` (13 refusals, then "-208 haystack tokens left"): one line naming the flags, nothing written."""
    from tests.support.cli import assert_one_line_error, run_cli

    afile = tmp_path / "afile"
    afile.write_text("keep")
    base = ["tune", tiny, "--length", N, "--budget", "2", "--search", "yarn", "--no-longrope", "--context",
            "passkey:0", "--quiet"]
    for extra, match in ((["--out", afile], f"--out {str(afile)!r} exists and is not a folder"),
                         (["--out", tmp_path / "o", "--target", "0"], "--target must be an integer >= 1, got 0"),
                         (["--out", tmp_path / "o", "--target", N], f"--length {N} and --target {N}: no room"),
                         (["--out", tmp_path / "o", "--length", "64"], "--length 64 must be more than the model's")):
        rc, err = run_cli(base + extra, capsys)
        assert_one_line_error(rc, err, match)
    assert afile.read_text() == "keep" and not (tmp_path / "o").exists()
