"""``posenc compat``: the family scan's two files, and an unknown family as one line."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from posenc import cli  # noqa: E402


def test_cli_compat_writes_both_files(tmp_path, capsys):
    md, js = tmp_path / "c.md", tmp_path / "c.json"
    assert cli.main(["compat", "--families", "llama", "--out", str(md), "--json", str(js), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["pass"] == 1
    assert "| llama | pass |" in md.read_text() and json.loads(js.read_text())["rows"][0]["family"] == "llama"


def test_cli_compat_unknown_family_is_one_line(capsys):
    assert cli.main(["compat", "llama", "bogus", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc: error: unknown transformers model families ['bogus']") and "\n" not in err
