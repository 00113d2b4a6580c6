"""The long-context suite's report: ``report.md``, a self-contained ``report.html`` and the plots.

What a reader sees first: the headline figure (effective length per method, with the reference it is judged
against), then the method x length table (perplexity of the same target tokens, retrieval with its Wilson 95%
interval and n), the cost table (seconds per prefill, peak memory, decode speed), accuracy by needle depth
(heatmaps) and per task kind, the paired differences against the preset's comparison rows past the trained length
(the same queries, Newcombe's paired interval), and last the run's details (machine, load, what was left out).
Every table is built once as rows (:class:`Table`) and rendered to both Markdown and HTML.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path

from posenc._figures import new_figure, save_png
from posenc.methods import is_identity
from posenc.tasks.ruler import QUERY_KINDS, RETRIEVAL_KINDS

__all__ = ["README_MARKS", "Table", "readme_block", "render_html", "render_markdown", "write_report"]

# docs/results/smollm2.md holds each committed suite run's tables between these marks (tests/repo/test_suite_readme.py)
README_MARKS = ("<!-- suite:{name}:begin -->", "<!-- suite:{name}:end -->")


@dataclass(frozen=True)
class Table:
    """A header and rows of already formatted cells."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "|".join("---" for _ in self.header) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in self.rows])

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in self.rows)
        return f"<table><tr>{head}</tr>{body}</table>"


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _rate(iv: dict | None) -> str:
    if not iv or not iv.get("n"):
        return "-"
    return f"{iv['value']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}] n={iv['n']}"


def _ppl(rec: dict) -> str:
    if rec.get("ppl") is None:
        return "-"
    iv = rec.get("ppl_interval")
    text = f"{rec['ppl']:.3g}" if rec["ppl"] < 1000 else f"{rec['ppl']:.0f}"
    return text + (f" [{iv['lo']:.3g}, {iv['hi']:.3g}]" if iv and iv.get("lo") is not None else "")


def _grid(results: dict) -> tuple[list[str], list[int], dict]:
    recs = results["records"]
    methods = list(dict.fromkeys(r["method"] for r in recs))
    lengths = sorted({r["eval_len"] for r in recs})
    return methods, lengths, {(r["method"], r["eval_len"]): r for r in recs}


def main_table(results: dict) -> Table:
    methods, lengths, by = _grid(results)
    eff = results.get("effective", {})
    rows = []
    for m in methods:
        e = eff.get(m, {})
        el = _k(e["effective_length"]) if e.get("effective_length") else "< " + _k(lengths[0])
        if e.get("left_out"):
            el += " (+ left out at " + ", ".join(_k(n) for n in e["left_out"]) + ")"
        if e.get("unfinished"):
            el += " (not finished at " + ", ".join(_k(n) for n in e["unfinished"]) + ")"
        cells = []
        for n in lengths:
            r = by.get((m, n))
            cells.append("-" if r is None else f"{_ppl(r)} / {_rate(r['retrieval'])}")
        rows.append((m, *cells, el))
    return Table(("method", *[f"{_k(n)}: PPL / retrieval" for n in lengths], "effective length"), tuple(rows))


def cost_table(results: dict) -> Table:
    methods, lengths, by = _grid(results)
    rows = []
    for m in methods:
        cells = []
        for n in lengths:
            r = by.get((m, n))
            if r is None:
                cells.append("-")
                continue
            mem = f"{r['peak_rss_mb'] / 1024:.1f} GiB" if r.get("peak_rss_mb") else "?"
            tok = f"{r['decode_tok_s']:.1f} tok/s" if r.get("decode_tok_s") else "?"
            cells.append(f"{r['prefill_s']:.0f} s / {mem} / {tok}")
        rows.append((m, *cells))
    return Table(("method", *[f"{_k(n)}: prefill / peak RSS / decode" for n in lengths]), tuple(rows))


def task_table(results: dict, length: int) -> Table:
    methods, _, by = _grid(results)
    kinds = [k for k in QUERY_KINDS if any(k in r.get("tasks", {}) for r in results["records"])]
    rows = []
    for m in methods:
        r = by.get((m, length))
        if r is not None:
            rows.append((m, *[_rate(r["tasks"].get(k)) for k in kinds]))
    chance = {k: next((r["tasks"][k]["chance"] for r in results["records"] if k in r.get("tasks", {})), None)
              for k in kinds}
    return Table(("method", *[f"{k} (chance {chance[k]:.2g})" for k in kinds]), tuple(rows))


def comparison_tables(results: dict) -> list[tuple[int, Table]]:
    """Per length past the trained one: each row's retrieval minus each comparison row's, on the same queries,
    ``+0.50 [-0.10, 0.85] (2-0 of 4)``: the difference, Newcombe's paired 95% interval, the queries only this
    row / only the other got right, and the pairs."""
    comps = results.get("comparisons") or []
    out = []
    for n in sorted({c["length"] for c in comps}):
        at = [c for c in comps if c["length"] == n]
        versus = list(dict.fromkeys(c["versus"] for c in at))
        by = {(c["method"], c["versus"]): c for c in at}
        rows = []
        for m in dict.fromkeys(c["method"] for c in at):
            cells = []
            for v in versus:
                c = by.get((m, v))
                cells.append("-" if c is None or not c["n"] else f"{c['value']:+.2f} [{c['lo']:+.2f}, "
                             f"{c['hi']:+.2f}] ({c['wins']}-{c['losses']} of {c['n']})")
            rows.append((m, *cells))
        out.append((n, Table(("method", *[f"minus {v}" for v in versus]), tuple(rows))))
    return out


_COMPARISON_TITLE = ("Paired differences in retrieval at {n} (this row minus the column's row on the same queries; "
                     "Newcombe's paired 95% interval; wins-losses of n)")


# ------------------------------------------------------------------------------------------------ plots
def _colors(methods: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return {m: ("black" if is_identity(m) else cmap(i % 20)) for i, m in enumerate(methods)}


def plot_effective(results: dict, path: Path) -> Path:
    """Headline: effective length per method (bars), the reference and the threshold in the title."""
    methods, lengths, _ = _grid(results)
    eff = results.get("effective", {})
    ref = results.get("reference", {})
    values = [eff.get(m, {}).get("effective_length") or 0 for m in methods]
    fig, (ax,) = new_figure(8, 0.32 * len(methods) + 1.6)
    colors = _colors(methods)
    unfinished = [bool(eff.get(m, {}).get("unfinished")) for m in methods]  # a report of a run not ended yet
    bars = ax.barh(range(len(methods)), [max(v, 1) for v in values], color=[colors[m] for m in methods])
    for bar, open_ in zip(bars, unfinished):
        if open_:
            bar.set_hatch("//")
            bar.set_alpha(0.5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [_k(n) for n in lengths])
    ax.set_xlim(lengths[0] / 2, lengths[-1] * 1.3)
    ax.set_yticks(range(len(methods)), [m + (" (not finished)" if o else "") for m, o in zip(methods, unfinished)])
    ax.invert_yaxis()
    train = results["meta"].get("train_len")
    if train:
        ax.axvline(train, color="grey", ls="--", lw=1)
    thr = ref.get("threshold")
    ax.set_title(f"effective context length (retrieval >= {thr:.2f} = {ref.get('fraction')} x untouched at "
                 f"{_k(ref.get('length', 0))}); dashed: trained length" if thr is not None else "effective length",
                 fontsize=9)
    return save_png(fig, path, 110)


def plot_lines(results: dict, path: Path) -> Path:
    """Retrieval (with Wilson bands) and target perplexity against length, one line per method."""
    methods, lengths, by = _grid(results)
    colors = _colors(methods)
    fig, (a1, a2) = new_figure(11, 4.2, 1, 2)
    for m in methods:
        pts = [(n, by[(m, n)]) for n in lengths if (m, n) in by]
        xs = [n for n, _ in pts]
        ys = [r["retrieval"]["value"] for _, r in pts]
        a1.plot(xs, ys, marker="o", color=colors[m], label=m, lw=2 if is_identity(m) else 1.2)
        lo = [r["retrieval"]["lo"] for _, r in pts]
        hi = [r["retrieval"]["hi"] for _, r in pts]
        if None not in lo:
            a1.fill_between(xs, lo, hi, color=colors[m], alpha=0.08)
        pp = [(n, r["ppl"]) for n, r in pts if r.get("ppl")]
        if pp:
            a2.plot(*zip(*pp), marker="o", color=colors[m], label=m, lw=2 if is_identity(m) else 1.2)
    for ax, title in ((a1, "retrieval (exact match, 95% Wilson band)"), (a2, "perplexity of the same target tokens")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [_k(n) for n in lengths])
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    a2.set_yscale("log")
    a1.set_ylim(-0.03, 1.03)
    a2.legend(fontsize=7, ncol=2, loc="upper left")
    return save_png(fig, path, 110)


def plot_depth(results: dict, path: Path) -> Path | None:
    """Accuracy by needle depth (fifths) x length, one heatmap per method, retrieval kinds pooled."""
    methods, lengths, _ = _grid(results)
    rows = [r for r in results.get("retrieval", []) if r["task"] in RETRIEVAL_KINDS]
    if not rows:
        return None
    cols = min(4, len(methods))
    nrows = math.ceil(len(methods) / cols)
    fig, axes = new_figure(2.6 * cols + 0.8, 2.1 * nrows + 0.4, nrows, cols)
    image = None
    for ax, m in zip(axes, methods):
        grid = [[math.nan] * len(lengths) for _ in range(5)]
        for j, n in enumerate(lengths):
            for b in range(5):
                sel = [r for r in rows if r["method"] == m and r["eval_len"] == n and
                       abs(r["depth_bin"][0] - b / 5) < 1e-9]
                if sel:
                    grid[b][j] = sum(r["accuracy"] * r["n"] for r in sel) / sum(r["n"] for r in sel)
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_title(m, fontsize=8)
        ax.set_xticks(range(len(lengths)), [_k(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(5), ["0-.2", ".2-.4", ".4-.6", ".6-.8", ".8-1"], fontsize=7)
    for ax in axes[len(methods):]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="accuracy (needle depth x length)")
    return save_png(fig, path, 100)


# ------------------------------------------------------------------------------------------------ pages
def _summary(results: dict) -> list[str]:
    ref = results.get("reference", {})
    lines = [f"Model: {results['meta'].get('model')}. Trained length {results['meta'].get('train_len')}."]
    if ref.get("threshold") is not None:
        lines.append(f"Reference: the untouched model's retrieval at {_k(ref['length'])} is {ref['retrieval']:.2f}; "
                     f"a length counts as effective while retrieval stays >= {ref['fraction']} x that = "
                     f"{ref['threshold']:.2f} at every length up to it (after RULER, arXiv 2404.06654, whose "
                     f"threshold is fixed instead: Llama-2-7B's 85.6% at 4k).")
        lines.append("Retrieval pools the kinds the untouched model solves above chance at the reference length: "
                     + ", ".join(ref.get("kinds", [])) + " (every kind is in the per-task tables).")
    for method, why in sorted(results["meta"].get("left_out", {}).items()):
        lines.append(f"Left out: {method} ({why}).")
    missing = results["meta"].get("missing") or {}
    if missing:
        lines.append(f"Not finished: this report was written before the run ended ({results['meta']['cells']} cells "
                     f"finished, {sum(missing.values())} not run yet: " + ", ".join(sorted(missing)) + "); rows at "
                     "those lengths hold the cells finished so far (n says how many answers).")
    from posenc.evals.report.suite_answer import identity_lines

    return lines + identity_lines(results["meta"])


def _sections(results: dict) -> list[tuple[str, Table | str]]:
    _, lengths, _ = _grid(results)
    out: list[tuple[str, Table | str]] = [
        ("Perplexity / retrieval by length", main_table(results)),
        ("Cost per cell (one prefill answers all queries of a context)", cost_table(results)),
    ]
    for n in lengths[-2:]:
        out.append((f"Accuracy per task kind at {_k(n)} (exact match, 95% Wilson interval, n)", task_table(results, n)))
    out += [(_COMPARISON_TITLE.format(n=_k(n)), t) for n, t in comparison_tables(results)]
    return out


SUMMARY_MARKS = ("<!-- suite-summary:{name}:begin -->", "<!-- suite-summary:{name}:end -->")
KEEPS_PPL = 1.25  # "keeps perplexity": within this factor of the untouched model's at the reference length


def verdict(results: dict, method: str) -> str:
    """What a row does past the trained length, by a stated rule: ``extends to N`` when its retrieval at some length
    past the trained one reaches the effective-length threshold (N: the longest such length; unlike the effective
    length, a miss at a shorter length, with other parameters, does not cap it); else ``keeps perplexity only``
    when its perplexity at every length it ran past the trained one stays within :data:`KEEPS_PPL` x the untouched
    model's at the reference length; else ``neither``. ``untouched`` for the reference row itself."""
    return _verdict(results, _grid(results)[2], method)


def _verdict(results: dict, by: dict, method: str) -> str:
    """:func:`verdict` on the ``(method, length) -> record`` map ``by`` already built from ``results``."""
    from posenc.methods import is_identity

    train, ref = results["meta"]["train_len"], results.get("reference", {})
    if is_identity(method):
        return "untouched"
    past = {n: r for (m, n), r in by.items() if m == method and n > train}
    if not past:
        return "not run past the trained length"
    thr = ref.get("threshold")
    reached = [n for n, r in past.items() if thr is not None and (r.get("retrieval") or {}).get("n")
               and r["retrieval"]["value"] >= thr]
    if reached:
        return f"extends to {_k(max(reached))}"
    base = by.get((ref.get("method"), ref.get("length")), {}).get("ppl")
    if base and all(r.get("ppl") is not None and r["ppl"] <= KEEPS_PPL * base for r in past.values()):
        return "keeps perplexity only"
    return "neither"


def summary_table(results: dict) -> Table:
    """One row per method for the README: at each length the perplexity and the retrieval as ``k/n``, the
    effective length, the verdict (:func:`verdict`), the prefill seconds at the two longest lengths and the peak
    memory at the longest length the row ran."""
    methods, lengths, by = _grid(results)
    eff = results.get("effective", {})
    longest = lengths[-2:]
    rows = []
    for m in methods:
        cells = []
        for n in lengths:
            r = by.get((m, n))
            iv = (r or {}).get("retrieval") or {}
            ppl = "-" if r is None or r.get("ppl") is None else (f"{r['ppl']:.3g}" if r["ppl"] < 1000
                                                                 else f"{r['ppl']:.0f}")
            cells.append("-" if r is None else f"{ppl}, {iv['k']}/{iv['n']}" if iv.get("n") else ppl)
        e = eff.get(m, {})
        el = _k(e["effective_length"]) if e.get("effective_length") else "< " + _k(lengths[0])
        prefill = " / ".join(f"{by[(m, n)]['prefill_s']:.0f}" if (m, n) in by else "-" for n in longest)
        ran = [n for n in lengths if (m, n) in by and by[(m, n)].get("peak_rss_mb")]
        mem = f"{by[(m, ran[-1])]['peak_rss_mb'] / 1024:.1f} GiB at {_k(ran[-1])}" if ran else "?"
        rows.append((m, *cells, el, _verdict(results, by, m), prefill, mem))
    return Table(("method", *[f"{_k(n)}: PPL, keys" for n in lengths], "effective length", "past the trained length",
                  "prefill s at " + " / ".join(_k(n) for n in longest), "peak RSS"), tuple(rows))


def summary_block(results: dict, name: str) -> str:
    """The README's summary of the committed run ``name``, between :data:`SUMMARY_MARKS`: for a run judged by the
    interval rule its verdicts with n and intervals and its keys by distance back at L, 2L and 4L
    (:func:`posenc.evals.report.suite_answer.summary_verdicts`, :func:`~posenc.evals.report.suite_answer.
    summary_distance`); for an earlier run :func:`summary_table`."""
    begin, end = (m.format(name=name) for m in SUMMARY_MARKS)
    if not _judged(results):
        return "\n".join([begin, "", summary_table(results).markdown(), "", end])
    from posenc.evals.report.suite_answer import summary_distance, summary_verdicts

    L = _k(results["meta"]["train_len"])
    verdicts, distance = Table(*_tupled(summary_verdicts(results))), Table(*_tupled(summary_distance(results)))
    return "\n".join([begin, "", verdicts.markdown(), "",
                      f"Keys found by distance back (k/n, Wilson 95%) at {L} (the control), twice and four times {L}:",
                      "", distance.markdown(), "", end])


def _tupled(header_rows: tuple) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    header, rows = header_rows
    return tuple(header), tuple(tuple(r) for r in rows)


def readme_block(results: dict, name: str) -> str:
    """The results page's (``docs/results/smollm2.md``) copy of a committed run ``name``, rendered from
    ``results.json`` exactly as ``report.md`` renders it, between :data:`README_MARKS` (the name is historical: the
    block lived in the README): for a run judged by the interval rule the answer-first report's first screen and
    tables (verdicts, keys by length and by distance, perplexity ratios, paired differences, cost; the per-task
    tables stay in ``report.md``); for an earlier run its summary, the method x length table, the cost table and
    the paired differences."""
    begin, end = (m.format(name=name) for m in README_MARKS)
    if _judged(results):  # the answer-first report's first screen and tables, its per-task tables left to it
        from posenc.evals.report.suite_answer import first_screen

        body = [begin, "", *first_screen(results), ""]
        for title, t in answer_sections(results):
            if not title.startswith("Accuracy per task kind"):
                body += [f"{title}:", "", t.markdown() if t.rows else "(none)", ""]
        return "\n".join(body + [end])
    body = [begin, "", *_summary(results), "", main_table(results).markdown(), "", cost_table(results).markdown(), ""]
    for n, table in comparison_tables(results):
        body += [_COMPARISON_TITLE.format(n=_k(n)) + ":", "", table.markdown(), ""]
    return "\n".join(body + [end])


def _judged(results: dict) -> bool:
    """Whether the run is judged by the interval rule (:mod:`posenc.evals.suite.verdict`): the answer-first pages
    of :mod:`posenc.evals.report.suite_answer`."""
    return (results.get("reference") or {}).get("rule") == "interval"


def answer_sections(results: dict) -> list[tuple[str, Table]]:
    """The tables of the answer-first pages, in order (the verdicts first)."""
    from posenc.evals.report import suite_answer as a

    ppl_header, ppl = a.ppl_rows(results)
    len_header, by_length = a.length_rows(results)
    out = [("Verdicts", Table(("method", "verdict", "effective length"), tuple(a.verdict_rows(results)))),
           ("Keys found by length (Wilson 95%) and perplexity", Table(len_header, tuple(by_length))),
           ("Keys found by distance back (Wilson 95%)", Table(("method", "length", "tokens back", "found",
                                                               "wrong: another key's value", "mean distance"),
                                                              tuple(a.distance_rows(results)))),
           ("Perplexity: paired ratios over passages (geometric mean, t 95% interval)", Table(ppl_header, tuple(ppl))),
           ("Paired differences in keys found (the same keys; Newcombe 95%)",
            Table(("length", "method", "minus", "difference", "wins-losses", "separated from 0"),
                  tuple(a.separated_rows(results)))),
           ("Cost (prefill seconds compared only under a similar load and machine speed; peak memory not reported)",
            Table(("method", "length", "prefill", "load", "matmul GFLOP/s", "cells"), tuple(a.cost_rows(results)))),
           ]
    for n in _grid(results)[1][-2:]:
        out.append((f"Accuracy per task kind at {_k(n)} (the pass key is the control)", task_table(results, n)))
    return out


def _answer_markdown(results: dict, images: list[Path]) -> str:
    from posenc.evals.report.suite_answer import first_screen

    meta = results["meta"]
    tables = answer_sections(results)
    verdicts = tables[0][1].markdown() if tables[0][1].rows else "None: no method is judged."
    out = [f"# posenc long-context suite: {meta.get('preset')}", "", *first_screen(results), "",
           "## " + tables[0][0], "", verdicts, ""]
    out += [f"![{p.stem}]({p.name})" for p in images[:1]] + [""]
    for i, (title, t) in enumerate(tables[1:]):
        out += [f"## {title}", "", t.markdown(), ""]
        if i == 1 and len(images) > 1:
            out += [f"![{images[1].stem}]({images[1].name})", ""]
    out += ["## Details", "", "```json", json.dumps({k: meta[k] for k in ("machine", "config") if k in meta},
                                                     indent=1, default=str), "```", ""]
    return "\n".join(out)


def _answer_html(results: dict, images: list[Path]) -> str:
    from posenc.evals.report.suite_answer import colors, first_screen

    meta = results["meta"]
    tables = answer_sections(results)
    col = colors(results)

    def img(p: Path) -> str:
        data = base64.b64encode(p.read_bytes()).decode()
        return f"<img alt='{html.escape(p.stem)}' src='data:image/png;base64,{data}'>"

    lines = first_screen(results)
    items = "".join(f"<li><span class='sw' style='background:rgb({','.join(str(round(255 * c)) for c in col[m][:3])})'>"
                    f"</span><b>{html.escape(m)}</b>: {html.escape(v)} <small>(effective length {html.escape(e)})"
                    f"</small></li>" for m, v, e in tables[0][1].rows)
    head = "".join(f"<p>{html.escape(x)}</p>" for x in lines[:2] + lines[3:])
    parts = [f"<h1>posenc long-context suite: {html.escape(str(meta.get('preset')))}</h1>",
             f"<div class='first'><div class='left'>{head}<ul id='verdicts'>{items}</ul></div>"
             f"<div class='right'>{img(images[0]) if images else ''}</div></div>",
             f"<p><small>{html.escape(lines[2])}</small></p>"]
    for i, (title, t) in enumerate(tables[1:]):
        parts.append(f"<h2>{html.escape(title)}</h2>{t.html()}")
        if i == 1 and len(images) > 1:
            parts.append(img(images[1]))
    details = html.escape(json.dumps({k: meta[k] for k in ("machine", "config", "left_out") if k in meta},
                                     indent=1, default=str))
    parts.append(f"<details><summary>Run details (machine, configuration)</summary><pre>{details}</pre></details>")
    style = ("body{font-family:sans-serif;max-width:1300px;margin:auto;font-size:14px} .first{display:flex;gap:16px}"
             ".left{flex:1} .right{flex:1.2} .right img{width:100%} ul{list-style:none;padding-left:0}"
             ".sw{display:inline-block;width:12px;height:12px;margin-right:6px} p{margin:4px 0}"
             "table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;padding:2px 6px;"
             "text-align:right} td:first-child{text-align:left} img{max-width:100%}")
    title = html.escape(str(meta.get("preset")))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>posenc suite {title}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def render_markdown(results: dict, images: list[Path]) -> str:
    if _judged(results):
        return _answer_markdown(results, images)
    meta = results["meta"]
    out = [f"# posenc long-context suite: {meta.get('preset')}", "", *_summary(results), ""]
    if images:
        out += [f"![{images[0].stem}]({images[0].name})", ""]
    for title, body in _sections(results):
        out += [f"## {title}", "", body.markdown() if isinstance(body, Table) else body, ""]
    out += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images[1:]]
    out += ["", "## Details", "", "```json", json.dumps({k: meta[k] for k in ("machine", "config") if k in meta},
                                                       indent=1, default=str), "```", ""]
    return "\n".join(out)


def render_html(results: dict, images: list[Path]) -> str:
    if _judged(results):
        return _answer_html(results, images)
    meta = results["meta"]

    def img(p: Path) -> str:
        data = base64.b64encode(p.read_bytes()).decode()
        return f"<img alt='{html.escape(p.stem)}' src='data:image/png;base64,{data}'>"

    parts = [f"<h1>posenc long-context suite: {html.escape(str(meta.get('preset')))}</h1>"]
    parts += [f"<p>{html.escape(line)}</p>" for line in _summary(results)]
    parts += [img(images[0])] if images else []
    for title, body in _sections(results):
        parts.append(f"<h2>{html.escape(title)}</h2>" + (body.html() if isinstance(body, Table) else
                                                         f"<p>{html.escape(body)}</p>"))
    parts += ["<h2>Plots</h2>"] + [img(p) for p in images[1:]]
    details = html.escape(json.dumps({k: meta[k] for k in ("machine", "config", "left_out") if k in meta},
                                     indent=1, default=str))
    parts.append(f"<details><summary>Run details (machine, configuration)</summary><pre>{details}</pre></details>")
    style = ("body{font-family:sans-serif;max-width:1250px;margin:auto} table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right} td:first-child{text-align:left}"
             "img{max-width:100%}")
    title = html.escape(str(meta.get("preset")))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>posenc suite {title}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def write_report(results: dict, out: Path) -> dict[str, Path]:
    """Plots, ``report.md`` and ``report.html`` into ``out`` (atomically); returns name -> path."""
    from posenc.runtime.atomic import atomic_write_bytes

    out = Path(out)
    if _judged(results):
        from posenc.evals.report.suite_answer import plot_accuracy, plot_distance

        images = [plot_accuracy(results, out / "accuracy_by_length.png")]
        dist = plot_distance(results, out / "accuracy_by_distance.png")
        images += [dist] if dist is not None else []
        paths = {"markdown": out / "report.md", "html": out / "report.html"}
        atomic_write_bytes(paths["markdown"], render_markdown(results, images).encode())
        atomic_write_bytes(paths["html"], render_html(results, images).encode())
        return {**paths, **{p.stem: p for p in images}}
    images = [plot_effective(results, out / "effective_length.png"), plot_lines(results, out / "by_length.png")]
    depth = plot_depth(results, out / "depth_heatmaps.png")
    images += [depth] if depth is not None else []
    paths = {"markdown": out / "report.md", "html": out / "report.html"}
    atomic_write_bytes(paths["markdown"], render_markdown(results, images).encode())
    atomic_write_bytes(paths["html"], render_html(results, images).encode())
    return {**paths, **{p.stem: p for p in images}}
