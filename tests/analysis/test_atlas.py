"""posenc.analysis.atlas: the committed atlas (docs/atlas.md and docs/atlas/*.png) is what the registry draws now."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import docs_pages
from posenc.analysis import atlas

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_current_and_names_every_method():
    from posenc.methods import HF_ONLY, METHODS, TRAINED_METHODS

    text = (ROOT / atlas.PAGE).read_text()
    assert text == atlas.page(), "docs/atlas.md is stale: run python -m benchmarks.docs_pages atlas"
    for name in [*METHODS, *TRAINED_METHODS]:
        assert f"### `{name}`" in text and f"(atlas/{name}.png)" in text, name
    assert all(f"`{name}`" in text.split("## Not drawn")[1] for name in HF_ONLY)


def test_every_figure_of_the_page_is_committed_and_no_other():
    linked = set(re.findall(r"\]\(atlas/([^)]+\.png)\)", atlas.page()))
    committed = {p.name for p in (ROOT / atlas.FIGURES).glob("*.png")}
    assert linked == committed == {f"{n}.png" for n, _, _ in atlas.entries()}


@pytest.mark.slow
def test_every_committed_figure_is_current():
    """Draws all of them again (about a minute on two cores) and compares the bytes."""
    assert atlas.stale(ROOT) == [], "the atlas is stale: run python -m benchmarks.docs_pages atlas"


def test_check_names_a_stale_file(tmp_path, monkeypatch, capsys):
    one = [e for e in atlas.entries() if e[0] == "rerope"]
    monkeypatch.setattr(atlas, "entries", lambda: one)
    assert docs_pages.main(["atlas", "--root", str(tmp_path)]) == 0
    assert docs_pages.main(["atlas", "--root", str(tmp_path), "--check"]) == 0
    (tmp_path / atlas.FIGURES / "rerope.png").write_bytes(b"old")
    (tmp_path / atlas.FIGURES / "gone.png").write_bytes(b"left over")
    assert docs_pages.main(["atlas", "--root", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "stale: docs/atlas/rerope.png" in err and "stale: docs/atlas/gone.png" in err
