"""``posenc data``: checking the installed default corpus, or a folder, prints its digest."""

from __future__ import annotations

import json
from pathlib import Path

from posenc import cli
from posenc.data import corpora


def test_posenc_data_check_prints_the_digest(capsys):
    assert cli.main(["data", "--check", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["sha256"] == corpora.GUTENBERG["sha256"]


def test_posenc_data_on_a_folder_prints_its_digest(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("hello")
    assert cli.main(["data", str(tmp_path)]) == 0
    assert "1 files, 5 bytes" in capsys.readouterr().out
    assert Path(tmp_path / "a.txt").read_text() == "hello"
