"""``posenc eval``: bad values on a real checkpoint, flags no method takes, the factor it prints, and a Hugging
Face model without text."""

from __future__ import annotations

import json

import pytest

from posenc import cli
from posenc.cli import main as cli_main
from tests.support.cli import assert_one_line_error, run_cli


@pytest.mark.parametrize("extra, match", [
    (["--method", "superrope"], "unknown method 'superrope'"),
    (["--method", "yarn+nope"], "unknown method 'yarn+nope'"),
    (["--method", "yarn", "--window", "4"], "parameter(s) ['window'] are taken by none of the methods ['yarn']"),
    (["--lengths", "0"], "--lengths must be an integer >= 1, got 0"),
])
def test_eval_on_a_real_checkpoint_refuses_bad_values(run_dir, extra, match, capsys):
    rc, err = run_cli(["eval", run_dir, *extra], capsys)
    assert_one_line_error(rc, err, match)


@pytest.mark.parametrize("extra, match", [
    (["--method", "rerope", "--factor", "2"], "parameter(s) ['factor'] are taken by none of the methods ['rerope']"),
    (["--factor", "2"], "method parameters ['factor'] were given but no method takes them"),
    (["--method", "yarn", "--param", "bogus=1"], "parameter(s) ['bogus'] are taken by none of the methods"),
    (["--method", "yarn", "--factor", "0.5"], "yarn.factor must be >= 1.0, got 0.5"),
])
def test_eval_flags_no_method_takes_are_refused_not_ignored(run_dir, extra, match, capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    argv = ["eval", run_dir, "--corpus", text, "--lengths", "32", *extra]
    if "0.5" in extra:  # a value out of range: the method's row is refused with the reason, and the exit is 1
        assert cli.main([str(a) for a in argv]) == 1
        out, err = capsys.readouterr()
        last = err.splitlines()[-1]
        assert last.startswith("posenc: 1 row(s) of the methods asked for were not evaluated") and match in last
        rows = [ln.split() for ln in out.splitlines()]
        assert [r[:2] for r in rows if r[:2] in (["rope", "none"], ["rope", "yarn"])] == [["rope", "none"],
                                                                                         ["rope", "yarn"]]
        yarn = " ".join(next(r for r in rows if r[:2] == ["rope", "yarn"]))
        assert f"not_applicable ({match})" in yarn, yarn
        return
    rc, err = run_cli(argv, capsys)
    assert_one_line_error(rc, err, match)


def test_eval_factor_is_used_and_printed(run_dir, capsys, tmp_path):
    """`posenc eval RUN --method yarn --factor 2` evaluates YaRN with factor 2 at every length (it recorded the
    per-length default 4.0 before) and the table shows the parameters each row used."""
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "r"
    rc = cli.main(["eval", str(run_dir), "--corpus", str(text), "--lengths", "32", "64", "--method", "yarn",
                   "--method", "rerope", "--factor", "2", "--out", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    records = json.loads((out / "results.json").read_text())["records"]
    assert [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()] == records
    yarn = [r for r in records if r["method"] == "yarn"]
    assert [r["params"]["factor"] for r in yarn] == [2.0, 2.0]  # not the length default 4.0 at 64 = 4L
    assert [r["params"] for r in records if r["method"] == "rerope"] == [{"window": 8}, {"window": 8}]
    lines = [ln for ln in printed.splitlines() if ln.split()[:2] in (["rope", "yarn"], ["rope", "rerope"])]
    assert len(lines) == 4 and all(("factor=2 " in ln) == (" yarn " in ln) for ln in lines)
    assert all("window=8" in ln for ln in lines if " rerope " in ln)


def test_hf_model_without_text_errors_cleanly(capsys):
    assert cli_main(["eval", "--hf-model", "some/dir"]) == 2
    assert "'some/dir' is not a run folder of `posenc train`, a Hugging Face model folder" in capsys.readouterr().err


def test_eval_out_that_is_a_file_or_holds_files_is_refused_before_anything_is_computed(run_dir, tmp_path, capsys,
                                                                                         monkeypatch):
    """``--out afile`` gave ``[Errno 17] File exists`` after the whole table was computed; ``--out`` over earlier
    results replaced them. Both are one line naming --out now, before any evaluation, the files as they were."""
    from posenc.evals.lab import evaluate

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **kw: pytest.fail("evaluated before refusing"))
    afile = tmp_path / "afile"
    afile.write_text("keep")
    rc, err = run_cli(["eval", run_dir, "--out", afile], capsys)
    assert_one_line_error(rc, err, f"--out {str(afile)!r} exists and is not a folder")
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "results.json").write_text('{"meta": {"command": "posenc eval"}}')
    rc, err = run_cli(["eval", run_dir, "--out", earlier], capsys)
    assert_one_line_error(rc, err, f"--out {str(earlier)!r} already holds files (results.json): give a new or empty")
    assert afile.read_text() == "keep" and [p.name for p in earlier.iterdir()] == ["results.json"]
    assert (earlier / "results.json").read_text() == '{"meta": {"command": "posenc eval"}}'


def test_a_repeated_param_is_refused_naming_it(run_dir, capsys, monkeypatch):
    """``--param factor=2 --param factor=4`` silently kept 4: one line naming --param and the key, nothing run."""
    from posenc.evals.lab import evaluate

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **kw: pytest.fail("evaluated"))
    rc, err = run_cli(["eval", run_dir, "--method", "yarn", "--param", "factor=2", "--param", "factor=4"], capsys)
    assert_one_line_error(rc, err, "--param factor is given twice (factor=2 and factor=4): give it once")
