"""``posenc bench --out``: a file, or a folder holding another command's results, is refused in one line naming --out
before anything is loaded or trained (the results there are kept); a real-model preset is stopped by a signal in
tests/evals/suite/test_grid.py."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import assert_one_line_error, run_cli


@pytest.mark.parametrize("preset", ["quick", "smollm2"])
def test_bench_out_that_is_a_file_is_one_line(preset, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    rc, err = run_cli(["bench", "--preset", preset, "--out", afile, "--quiet"], capsys)
    assert_one_line_error(rc, err, f"--out {str(afile)!r} exists and is not a folder")
    assert afile.read_text() == "keep"


@pytest.mark.parametrize("preset, meta, match", [
    ("smollm2", {"model_id": "m", "length": 512, "budget_forwards": 4}, "holds the results of posenc tune"),
    ("quick", {"preset": "smollm2", "model_id": "m"}, "holds the results of posenc bench (real-model preset)"),
    ("smollm2", {"preset": "quick", "runs_dir": "r"}, "holds the results of posenc bench (lab preset)"),
    ("smollm2", {"preset": "smollm2_full", "model_id": "m"}, "(preset 'smollm2_full'; this one: preset 'smollm2')"),
    ("quick", {"command": "posenc eval"}, "holds the results of posenc eval"),
])
def test_bench_out_holding_other_results_is_refused_and_kept(preset, meta, match, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"meta": meta}))
    (out / "report.md").write_text("# theirs")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, err = run_cli(["bench", "--preset", preset, "--out", out, "--quiet"], capsys)
    assert_one_line_error(rc, err, match)
    assert f"--out {str(out)!r}" in err and {p.name: p.read_bytes() for p in out.iterdir()} == before
