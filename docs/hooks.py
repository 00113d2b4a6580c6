"""mkdocs hooks: the method catalogue (docs/methods.md) is generated from posenc's registries at build time
(:data:`posenc.methods.METHODS`, ``TRAINED_METHODS``, ``HF_ONLY``), so it cannot drift from the code; and the results
pages show the figures committed beside their numbers under ``benchmarks/results/`` (outside ``docs/``): a page links
them by their path in the repository (``../../benchmarks/results/RUN/NAME.png``, right on GitHub too), and the build
copies every such figure into the site as ``benchmarks/results/RUN/NAME.png`` and points the link there."""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "<!-- catalogue -->"
ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/"
#: an image or link whose target climbs out of docs/ into benchmarks/results/
OUTSIDE = re.compile(r"\]\(((?:\.\./)+)(" + re.escape(RESULTS) + r"[^)\s]+)\)")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _paper(paper: str) -> str:
    if paper.startswith("arXiv:"):
        return f"[{paper}](https://arxiv.org/abs/{paper.removeprefix('arXiv:')})"
    return f"<{paper}>" if paper.startswith("http") else _cell(paper)


def _params(method) -> str:
    parts = []
    for p in method.params:
        if p.required:
            parts.append(f"`{p.name}` (required)")
        elif p.default is not None:
            parts.append(f"`{p.name}={p.default}`")
        else:
            parts.append(f"`{p.name}` ({_cell(p.rule) or 'per length'})")
    return ", ".join(parts) or "none"


def catalogue() -> str:
    """Three Markdown tables: inference-time methods, trained-in methods, transformers-only methods."""
    from posenc.methods import HF_ONLY, METHODS, TRAINED_METHODS

    out = []
    for title, registry in (("Inference-time methods (`--method`, `PositionScheme.extend`, `posenc.hf.extend`)",
                             METHODS),
                            ("Trained-in methods (`posenc train --scheme`, `PositionScheme.preset`)", TRAINED_METHODS),
                            ("Methods only `posenc.hf.extend` applies (transformers' own code)", HF_ONLY)):
        out += [f"## {title}", "", "| name | kind | what it does | parameters | paper |", "|---|---|---|---|---|"]
        for name in sorted(registry):
            m = registry[name]
            aliases = f" (also {', '.join(f'`{a}`' for a in m.aliases)})" if m.aliases else ""
            out.append(f"| `{name}`{aliases} | {m.kind} | {_cell(m.description)} | {_params(m)} | {_paper(m.paper)} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    """Replace the catalogue marker with the generated tables; point links to committed results at the site's copy."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, catalogue())
    return site_links(markdown, page.file.src_uri) if page is not None else markdown


def _figures() -> list[str]:
    """Every committed results figure, as its path in the repository (``benchmarks/results/RUN/NAME.png``, or
    ``benchmarks/results/NAME.png`` beside a timing JSON: ``benchmarks/figures.py``)."""
    return sorted(p.relative_to(ROOT).as_posix() for pattern in ("*.png", "*/*.png")
                  for p in (ROOT / RESULTS).glob(pattern))


def on_files(files, config, **kwargs):
    """Add the committed results figures to the site, at their repository paths."""
    from mkdocs.structure.files import File

    for rel in _figures():
        if files.get_file_from_path(rel) is None:
            files.append(File.generated(config, rel, abs_src_path=str(ROOT / rel)))
    return files


def site_links(markdown: str, src_uri: str) -> str:
    """Links of a page at ``src_uri`` (relative to docs/) that climb to ``benchmarks/results/`` in the repository,
    rewritten to the copy in the site (one ``../`` fewer: the site's root is docs/, the repository's is its parent).
    A link that climbs any other number of levels is left alone (mkdocs then reports it)."""
    depth = src_uri.count("/")

    def fix(m: re.Match) -> str:
        ups, target = m.group(1), m.group(2)
        return f"]({'../' * depth}{target})" if ups == "../" * (depth + 1) else m.group(0)

    return OUTSIDE.sub(fix, markdown)
