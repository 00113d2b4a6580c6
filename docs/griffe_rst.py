"""Griffe extension (mkdocs.yml: the python handler's ``extensions``): posenc's docstrings are written with reST
inline markup, which Markdown would show raw. Before mkdocstrings renders a docstring this turns

- a role (``:func:`x```, ``:class:`~a.b.C```, ``:mod:``, ``:data:``, ``:meth:``, ``:attr:``, ...) into a
  cross-reference to the object it names, resolved in the docstring's own scope (a code span that links to the
  object's API entry where the site documents it, a plain code span where it does not);
- a ``double-backtick`` literal into a Markdown code span;
- a paragraph ending in ``::`` (a reST literal block follows) into one ending in ``:``, with the markup inside the
  indented block reduced to plain text (it renders as a code block);
- a reST simple table (``====  ====`` borders; a row whose first cell is empty continues the row above) into a
  Markdown table.

Nothing in posenc's source changes: only the text griffe hands to mkdocstrings."""

from __future__ import annotations

import html
import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|mod|data|meth|attr|obj|exc|const|type):`(~?)([^`]+)`")
LITERAL = re.compile(r"``(.+?)``", flags=re.S)
BORDER = re.compile(r"^ *=+( +=+)+ *$")
ROOT = "posenc"


def _target(obj, name: str, collection) -> str:
    """The full path of ``name`` as seen from ``obj`` (its imports, its module, its parents), followed to the
    object an alias points at; ``name`` itself when it cannot be resolved."""
    name = name.strip().rstrip("()")
    head, _, rest = name.partition(".")
    full = name
    if head != ROOT and obj is not None:
        try:
            full = obj.resolve(head) + (f".{rest}" if rest else "")
        except Exception:  # noqa: BLE001 - an unresolvable name stays as written (a plain code span)
            full = name
    try:
        found = collection[full] if collection is not None else None
        if found is not None and found.is_alias:
            full = found.final_target.path
    except Exception:  # noqa: BLE001 - not in the loaded collection, or an alias to something not loaded
        pass
    return full


def _role(match: re.Match, obj, collection) -> str:
    tilde, name = match.group(1), match.group(2).strip()
    shown = name.rstrip("()").rsplit(".", 1)[-1] if tilde else name
    full = _target(obj, name, collection)
    return f'<autoref identifier="{html.escape(full)}" optional><code>{html.escape(shown)}</code></autoref>'


def _plain(line: str) -> str:
    """Markup inside a literal block: the text only."""
    line = ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), line)
    return LITERAL.sub(r"\1", line)


def _code(match: re.Match) -> str:
    text = " ".join(match.group(1).split())  # a literal may wrap over lines
    return f"<code>{html.escape(text)}</code>" if "`" in text else f"`{text}`"


def _inline(chunk: str, obj, collection) -> str:
    chunk = ROLE.sub(lambda m: _role(m, obj, collection), chunk)
    return LITERAL.sub(_code, chunk)


def _cells(line: str, starts: list[int]) -> list[str]:
    ends = [*starts[1:], None]
    return [line[a:b].strip() if b is not None else line[a:].strip() for a, b in zip(starts, ends)]


def _table(lines: list[str]) -> list[str]:
    """A reST simple table (its lines, borders included) as Markdown table lines."""
    starts = [m.start() for m in re.finditer(r"=+", lines[0])]
    rows: list[list[str]] = []
    for line in lines[1:]:
        if BORDER.match(line) or not line.strip():
            continue
        cells = _cells(line, starts)
        if rows and not cells[0] and len(rows) > 1:  # a continuation line of a body row
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    md = ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return [md[0], "|" + "---|" * len(starts), *md[1:]]


def _tables(text: str) -> str:
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if BORDER.match(lines[i]):
            borders = [j for j in range(i, len(lines)) if BORDER.match(lines[j])][:3]
            if len(borders) == 3 and borders[1] > i + 1:
                out += _table(lines[i:borders[2] + 1])
                i = borders[2] + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def convert(text: str, obj=None, collection=None) -> str:
    """Markdown for a docstring written with reST inline markup (the module docstring says what changes)."""
    out: list[str] = []
    prose: list[str] = []  # lines outside literal blocks, converted together (a literal or role may wrap)
    block_indent: int | None = None  # inside a literal block: the indentation of the paragraph that opened it
    for line in _tables(text).split("\n"):
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if not line.strip() or indent > block_indent:
                out.append(_plain(line))
                continue
            block_indent = None
        if line.rstrip().endswith("::"):
            block_indent = indent
            stripped = line.rstrip()[:-2].rstrip()
            line = stripped + ":" if stripped else ""
        prose.append(line)
        if block_indent is not None:  # the paragraph before a literal block ends here
            out.append(_inline("\n".join(prose), obj, collection))
            prose = []
    if prose:
        out.append(_inline("\n".join(prose), obj, collection))
    return "\n".join(out)


def _walk(obj, seen: set[int]):
    if id(obj) in seen or obj.is_alias:
        return
    seen.add(id(obj))
    yield obj
    for member in list(obj.members.values()):
        yield from _walk(member, seen)


class RestToMarkdown(griffe.Extension):
    """Rewrites every docstring of the loaded package once it is loaded (imports resolved)."""

    def on_package(self, *, pkg, loader, **kwargs) -> None:
        collection = loader.modules_collection
        for obj in _walk(pkg, set()):
            if obj.docstring is not None:
                obj.docstring.value = convert(obj.docstring.value, obj, collection)
