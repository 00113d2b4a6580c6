"""``posenc schemes``: lists the presets and methods (with the papers of the trained-in ones) and prints a preset."""

from __future__ import annotations

import json

from posenc import PositionScheme
from posenc.methods import TRAINED_METHODS
from posenc.scheme.core import METHODS

NEW = ("p_rope", "cope", "fox", "fire")


def test_schemes_cli_lists_them_with_papers(capsys):
    from posenc.cli import main

    assert main(["schemes"]) == 0
    out = capsys.readouterr().out
    for name in NEW:
        m = METHODS.get(name) or TRAINED_METHODS[name]
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name + " "))
        assert m.paper in line, line


def test_schemes_cli_lists_and_prints(capsys):
    from posenc.cli import main

    assert main(["schemes"]) == 0
    out = capsys.readouterr().out
    assert "rerope" in out and "alibi" in out
    assert main(["schemes", "yarn", "--train-len", "64", "--param", "factor=4"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rope"]["scaling"]["factor"] == 4
    assert set(METHODS) <= set(PositionScheme.presets())
