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


# ============================================================================ lists, figures and commands
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+\S")


def run_on_lists(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of every Markdown list that starts right under a paragraph line: Python-Markdown
    (mkdocs) needs a blank line there, and without one the list renders as part of the paragraph. A list under a
    heading, inside a list, or in a code block is fine."""
    out, fence, in_list, prev = [], False, False, ""
    for i, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fence, in_list, prev = not fence, False, line
            continue
        if fence:
            continue
        if LIST_ITEM.match(line):
            if prev.strip() and not in_list and not prev.lstrip().startswith("#"):
                out.append((i, line))
            in_list = True
        elif line.strip() and (not prev.strip() and not line.startswith((" ", "\t")) or prev.lstrip().startswith("#")):
            in_list = False  # a paragraph after a blank line (not an indented continuation) ends the list
        prev = line
    return out


def test_run_on_list_detector():
    assert run_on_lists("Text:\n- a\n- b\n") == [(2, "- a")]
    assert run_on_lists("Text:\n\n- a\n  more\n- b\n\n1. c\n") == []
    assert run_on_lists("## Head\n- a\n\nPara\n2. b\n```\nx\n- y\n```\n") == [(5, "2. b")]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_no_list_runs_into_the_paragraph_above(page):
    assert run_on_lists(page.read_text()) == [], f"add a blank line before these lists in {page.name}"


IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
RESULT_PAGES = sorted((DOCS / "results").glob("*.md"))


def _committed_figures(page: Path) -> set[Path]:
    """The figures committed beside the page's sources (``<!-- source: ... -->``): the PNGs of each source's run
    folder under ``benchmarks/results/``, and for a source directly in it (a timing or coverage JSON) the PNG of the
    same name (``benchmarks/figures.py``)."""
    results = ROOT / "benchmarks" / "results"
    sources = {ROOT / path for paths in re.findall(r"<!-- source: (.*?) -->", page.read_text())
               for path in paths.split()}
    runs = {s.parent for s in sources if s.parent != results}
    beside = {s.with_suffix(".png") for s in sources if s.parent == results and s.with_suffix(".png").is_file()}
    return {png for run in runs for png in run.glob("*.png")} | beside


@pytest.mark.parametrize("page", RESULT_PAGES, ids=[p.name for p in RESULT_PAGES])
def test_results_pages_show_their_committed_figures(page):
    """A results page whose runs committed figures shows figures, and each is a committed file of those runs (linked
    by its path in the repository; the docs hook serves the ones under benchmarks/results/)."""
    committed = _committed_figures(page)
    shown = {(page.parent / target).resolve() for alt, target in IMAGE.findall(page.read_text()) if alt}
    if committed:
        assert shown, f"{page.name} shows none of its runs' figures"
        assert shown <= committed, sorted(map(str, shown - committed))
    else:
        assert not shown, page.name


def test_every_results_page_shows_figures():
    """Every results page has a figure (its runs' own, or one drawn from its JSON by benchmarks/figures.py), and every
    run with figures has at least one of them shown."""
    shown = set().union(*({(p.parent / t).resolve() for _, t in IMAGE.findall(p.read_text())} for p in RESULT_PAGES))
    for page in RESULT_PAGES:
        assert _committed_figures(page), f"{page.name}: none of its sources has a figure"
        runs = {png.parent for png in _committed_figures(page)} - {ROOT / "benchmarks" / "results"}
        assert all(any(s.parent == run for s in shown) for run in runs), page.name


def test_every_image_in_the_docs_exists():
    for page in PAGES:
        for _, target in IMAGE.findall(page.read_text()):
            assert target.startswith("http") or (page.parent / target).resolve().is_file(), (page, target)


def test_the_hook_serves_results_figures_at_their_repository_paths():
    sys.path.insert(0, str(DOCS))
    try:
        import hooks
    finally:
        sys.path.remove(str(DOCS))
    text = "![a](../../benchmarks/results/bench-quick/headline.png) and [b](../../../benchmarks/results/x.png)"
    assert hooks.site_links(text, "results/quick.md") == ("![a](../benchmarks/results/bench-quick/headline.png) and "
                                                          "[b](../../../benchmarks/results/x.png)")
    assert hooks.site_links("![a](../benchmarks/results/r/f.png)", "index.md") == "![a](benchmarks/results/r/f.png)"
    assert "benchmarks/results/bench-quick/headline.png" in hooks._figures()


def _deprecated_flags() -> dict[str, set[str]]:
    """Subcommand -> its old spellings (hidden flags that warn: posenc.cli._common.deprecated)."""
    import argparse

    from posenc.cli import build_parser
    from posenc.cli._common import _Deprecated

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: {s for a in p._actions if isinstance(a, _Deprecated) for s in a.option_strings}
            for name, p in sub.choices.items()}


def test_docs_commands_use_current_flags():
    """No command shown in a code block of the docs (or the README) uses a flag its subcommand only keeps as an old
    spelling (docs/cli.md's table lists them on purpose, outside code blocks)."""
    old = _deprecated_flags()
    assert "--hf-model" in old["eval"] and "--methods" in old["eval"]
    bad = []
    for page in [*PAGES, ROOT / "README.md"]:
        for block in re.findall(r"```(?:bash|sh|text)?\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.splitlines():
                m = re.search(r"\bposenc (\w+)\b(.*)", line)
                if m and m.group(1) in old:
                    used = set(re.findall(r"(?<!\S)(--[\w-]+)", m.group(2).split("#")[0])) & old[m.group(1)]
                    bad += [f"{page.name}: {line.strip()} ({', '.join(sorted(used))})"] if used else []
    assert not bad, bad
