"""The document layer of the lab's reports: the small Markdown subset they are written in, turned into a
self-contained HTML page, and the blocks both formats share.

- :func:`md_to_html`: headings (``#``, ``##``), bullets (``- ``), pipe tables, images (``![alt](file)``, embedded
  as base64 data URIs from the given paths), ``**bold**`` and ```code```, paragraphs; raw ``<details>`` blocks
  pass through.
- :func:`details_md`: machine and timing JSON folded in a ``<details>`` block (GitHub renders it collapsed).
- :func:`check_items` / :func:`checks_md`: PASS/FAIL/SKIP check lines rewritten as what was expected and what was
  observed ("as expected" / "not as expected" / "no data"): an expected failure of a baseline is not an alarm.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["CSS", "check_items", "checks_md", "details_md", "md_to_html", "page"]

CSS = """body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 12px}
table{border-collapse:collapse;font-size:13px} td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
td:first-child,th:first-child,td.t{text-align:left} h1{margin:10px 0 4px} h2{margin:14px 0 6px}
ul{margin:4px 0} li{margin:2px 0} p{margin:6px 0} img{max-width:100%}
.expected{color:#2d6a2d} .unexpected{color:#a35c00} .skip{color:#888}
li.v-extends b:first-child{background:#b8e0b0} li.v-local-only b:first-child{background:#f6e3a8}
li.v-fails b:first-child{background:#dcdcdc} li b:first-child{padding:0 3px}
details{margin:8px 0} summary{cursor:pointer;color:#444} pre{white-space:pre-wrap;font-size:12px}"""

_NUMBER = re.compile(r"^(-|[-+]?\d[\d.]*([eE][-+]?\d+)?%?( .*)?)$")  # right-aligned cells: numbers, "-"
_CHECK = {"PASS": ("expected", "as expected"), "FAIL": ("unexpected", "not as expected"), "SKIP": ("skip", "no data")}


def check_items(lines: Sequence[str]) -> list[tuple[str, str]]:
    """``(css class, text)`` per check line ``"PASS: ..."``: the verdict as expected / not as expected / no data,
    then the line's own text (which states the expected and the observed value)."""
    out = []
    for line in lines:
        head, _, rest = line.partition(": ")
        cls, word = _CHECK.get(head, ("skip", head.lower()))
        out.append((cls, f"{word}: {rest}"))
    return out


def checks_md(lines: Sequence[str]) -> str:
    """Markdown bullets of :func:`check_items`."""
    return "\n".join(f"- {text}" for _, text in check_items(lines))


def details_md(meta: Mapping, keys: Sequence[str] = ("machine", "timings")) -> str:
    """A ``<details>`` block with ``meta[key]`` as JSON for each key present ("" when none is)."""
    body = [f"<b>{html.escape(k)}</b>\n<pre>{html.escape(json.dumps(meta[k], indent=1, default=str), quote=False)}"
            f"</pre>" for k in keys if k in meta]
    if not body:
        return ""
    shown = [k for k in keys if k in meta]
    names = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
    return f"<details><summary>{names} (JSON)</summary>\n\n" + \
        "\n".join(body) + "\n</details>"


def _inline(text: str) -> str:
    text = html.escape(text, quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<![\w*])\*([^*]+)\*(?![\w*])", r"<i>\1</i>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _image(line: str, images: Mapping[str, Path]) -> str:
    m = re.fullmatch(r"!\[(.*?)\]\((.+?)\)", line.strip())
    path = images.get(m.group(2)) if m else None
    if path is None:
        return f"<p>{_inline(line)}</p>"
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f"<img alt='{html.escape(m.group(1))}' src='data:image/png;base64,{data}'>"


def _table(rows: list[str]) -> str:
    out = ["<table>"]
    body = [r for r in rows if not all(set(c.strip()) <= set("-:") for c in r.strip().strip("|").split("|"))]
    for i, row in enumerate(body):
        tag = "th" if i == 0 else "td"
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        out.append("<tr>" + "".join(f"<{tag}{'' if i == 0 or _NUMBER.match(c) else ' class=t'}>{_inline(c)}</{tag}>"
                                    for c in cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def md_to_html(md: str, images: Mapping[str, Path] | None = None, classes: Sequence[str] = ()) -> str:
    """HTML of the Markdown subset in the module docstring. ``images``: file name -> PNG path to embed.
    ``classes``: css classes given, in order, to the bullets that start with a check word (``as expected``...)."""
    images, out, block, kind = dict(images or {}), [], [], None
    classes = list(classes)
    raw = False

    def flush():
        nonlocal block, kind
        if kind == "table":
            out.append(_table(block))
        elif kind == "list":
            out.append("<ul>" + "".join(block) + "</ul>")
        block, kind = [], None

    for line in md.splitlines():
        if line.startswith("<details") or raw:
            flush()
            out.append(line)
            raw = not line.startswith("</details>")
            continue
        new = "table" if line.startswith("|") else "list" if line.startswith("- ") else None
        if new != kind:
            flush()
        kind = new
        if new == "table":
            block.append(line)
        elif new == "list":
            cls = classes.pop(0) if classes and line[2:].startswith(tuple(w for _, w in _CHECK.values())) else ""
            head = re.match(r"\*\*([a-z ]+)\*\*", line[2:])
            cls = cls or (f"v-{head.group(1).replace(' ', '-')}" if head else "")
            block.append(f"<li{f' class={cls!r}' if cls else ''}>{_inline(line[2:])}</li>")
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
        elif line.startswith("!["):
            out.append(_image(line, images))
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(out)


def page(title: str, body: str) -> str:
    """A complete HTML document around ``body``."""
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>\n"
            f"<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")
