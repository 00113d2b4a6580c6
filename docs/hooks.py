"""mkdocs hook: the method catalogue (docs/methods.md) is generated from posenc's registries at build time
(:data:`posenc.methods.METHODS`, ``TRAINED_METHODS``, ``HF_ONLY``), so it cannot drift from the code."""

from __future__ import annotations

MARKER = "<!-- catalogue -->"


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
    """Replace the catalogue marker with the generated tables."""
    return markdown.replace(MARKER, catalogue()) if MARKER in markdown else markdown
