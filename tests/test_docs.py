"""The documentation site (docs/, mkdocs.yml): every Python example in it runs as written (its own asserts check
what the text says), the method catalogue is generated from the registries, and `mkdocs build --strict` (warnings
are errors) is run by `make docs`, which `make test` runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# architecture.md's ```python blocks are signatures to read, not examples (the other pages' blocks are examples)
BLOCKS = [(page, i, block) for page in PAGES if page.name != "architecture.md"
          for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))]


def test_the_site_has_its_pages_and_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert page.relative_to(DOCS).as_posix() in nav, page
    for guide in ("scheme", "hf", "suite", "tune", "lab", "report"):
        assert (DOCS / "guides" / f"{guide}.md").is_file()
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("page, i, block", BLOCKS, ids=[f"{p.relative_to(DOCS)}[{i}]" for p, i, _ in BLOCKS])
def test_docs_example_runs(page, i, block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes ("runs/...") writes here
    exec(compile(block, f"{page.relative_to(ROOT)}[python block {i}]", "exec"), {"__name__": "__docs__"})


def test_method_catalogue_is_generated_from_the_registry():
    sys.path.insert(0, str(DOCS))
    try:
        import hooks
    finally:
        sys.path.remove(str(DOCS))
    from posenc.scheme.methods import HF_ONLY, METHODS, TRAINED_METHODS

    text = hooks.catalogue()
    for name in [*METHODS, *TRAINED_METHODS, *HF_ONLY]:
        assert f"| `{name}`" in text, name
    page = (DOCS / "methods.md").read_text()
    assert hooks.MARKER in page
    assert hooks.on_page_markdown(page, None, None, None).count("| `yarn`") == 1
