"""The documentation site (docs/, mkdocs.yml): every Python example in it runs as written (its own asserts check
what the text says), the method catalogue is generated from the registries, and `mkdocs build --strict` (warnings
are errors) is run by `make docs`, which `make test` runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    from posenc.methods import HF_ONLY, METHODS, TRAINED_METHODS

    text = hooks.catalogue()
    for name in [*METHODS, *TRAINED_METHODS, *HF_ONLY]:
        assert f"| `{name}`" in text, name
    page = (DOCS / "methods.md").read_text()
    assert hooks.MARKER in page
    assert hooks.on_page_markdown(page, None, None, None).count("| `yarn`") == 1


# ============================================================================ reST markup in the API pages
RAW_REST = re.compile(r":(?:func|class|mod|data|meth|attr|obj|exc|const):|``|::</p>|={6,} +={6,}")


def _griffe_rst():
    sys.path.insert(0, str(DOCS))
    try:
        import griffe_rst
    finally:
        sys.path.remove(str(DOCS))
    return griffe_rst


def test_rest_roles_and_literals_become_markdown():
    g = _griffe_rst()
    text = ("See :func:`posenc.hf.extend` and :class:`~posenc.scheme.PositionScheme`; ``a+b`` parses.\n"
            "A run directory holds::\n\n    config.json   ``extra`` (:func:`f`)\n\nAfter.")
    out = g.convert(text)
    assert '<autoref identifier="posenc.hf.extend" optional><code>posenc.hf.extend</code></autoref>' in out
    assert '<code>PositionScheme</code></autoref>' in out and "`a+b` parses" in out
    assert "holds:\n\n    config.json   extra (f)\n\nAfter." in out
    assert not RAW_REST.search(out.replace("</autoref>", ""))
    table = ("Parts:\n\n======  ==========\npart    field\n======  ==========\nmask    ``mask``\n        (a MaskSpec)\n"
             "bias    a | b\n======  ==========\n\nAfter.")
    assert g.convert(table) == ("Parts:\n\n| part | field |\n|---|---|\n| mask | `mask` (a MaskSpec) |\n"
                                "| bias | a \\| b |\n\nAfter.")


def test_every_docstring_loses_its_rest_markup():
    """posenc's docstrings do use reST roles (so the conversion matters), and after the extension none is left:
    what mkdocstrings renders is Markdown."""
    import griffe

    g = _griffe_rst()
    raw = griffe.load("posenc", search_paths=[str(ROOT)], resolve_aliases=False)
    converted = griffe.load("posenc", search_paths=[str(ROOT)], resolve_aliases=False,
                            extensions=griffe.load_extensions(g.RestToMarkdown()))
    docs = lambda pkg: [o.docstring.value for o in g._walk(pkg, set()) if o.docstring is not None]  # noqa: E731
    assert sum(len(g.ROLE.findall(d)) for d in docs(raw)) > 100
    left = [d[:80] for d in docs(converted) if g.ROLE.search(d) or "``" in d]
    assert not left, left


@pytest.mark.slow
def test_built_api_pages_show_no_raw_rest_markup(tmp_path):
    """`mkdocs build --strict` into a temporary folder: no API page shows a raw role (``:func:``), a
    double-backtick literal or a reST ``::``, and the roles became links (autorefs) into the API pages."""
    import subprocess

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
                   cwd=ROOT, check=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    pages = sorted((site / "api").glob("*/index.html"))
    assert len(pages) >= 6
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert not RAW_REST.search(html), (page, RAW_REST.search(html).group(0))
    assert 'class="autorefs autorefs-internal"' in (site / "api" / "scheme" / "index.html").read_text()
