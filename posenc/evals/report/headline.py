"""The headline of a bench report: which methods extend past the trained length, which only look locally, which fail.

One point per report row (a trained scheme, or a method applied to one) at ``N``, the longest length evaluated
for both perplexity and retrieval:

- x: the perplexity ratio PPL(N)/PPL(L) (``L`` the row's trained length); with several seeds the geometric mean of
  the per-seed ratios and its t interval (:func:`posenc.evals.stats.pooling.ratio_interval`), with one seed no interval;
- y: the accuracy on needles farther back than ``L`` at ``N``, trials pooled over the far cells and the seeds,
  with its Wilson 95% interval (:func:`posenc.evals.stats.pooling.far_interval`);
- the regions of :mod:`posenc.evals.stats.verdict` (extends / local only / fails) shaded, the thresholds labelled.

The task is ``kv_recall`` (multi-pair key matching) when the results have it; else ``recall``, which has one needle
and is a *content-copy control* (a model can copy the value after the key with content-based attention alone),
and the report says so. Baselines (a trained model that methods are applied to) are expected to fail past ``L``;
their verdict is shown as expected, not as an alarm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from posenc._figures import new_figure, save_png
from posenc.evals.report.families import FAMILIES, palette
from posenc.evals.stats.intervals import Interval, separated
from posenc.evals.stats.pooling import far_interval, method_key, ratio_interval
from posenc.evals.stats.verdict import FAILS, FAR_OK, PPL_KEEP, VERDICTS, borderline, classify, thresholds_text
from posenc.methods import is_identity

__all__ = ["HEADLINE_TASKS", "TASK_LABELS", "TASK_SHORT", "HeadlineRow", "baseline_checks", "headline",
           "headline_markdown", "plot_headline"]

X_CAP = 6.0  # the figure's x axis ends here (at the latest): farther ratios are drawn at the edge
# the headline task: the first of these the results have
HEADLINE_TASKS = ("kv_recall", "recall", "passkey", "niah_mk", "niah_mq", "niah_mv", "vt", "cwe", "offset")
TASK_SHORT = {"kv_recall": "key-value recall with several pairs (kv_recall)",
              "recall": "single-needle recall, a *content-copy control*, not a positional test (recall)",
              "offset": "offset recall, a positional task (offset)", "passkey": "passkey retrieval (passkey)"}
TASK_LABELS = {
    "kv_recall": "key-value recall with several pairs (the query key must be matched among distractor keys)",
    "recall": "single-needle recall, a content-copy control (one key in the context: content-based attention "
              "can copy its value without locating it; kv_recall is the positional test)",
    "offset": "offset recall (a positional task)",
    "passkey": "passkey retrieval (Landmark Attention's task)",
}


@dataclass
class HeadlineRow:
    """One point of the headline: a row, its two measurements with intervals, and its verdict."""

    scheme: str
    method: str
    label: str
    train_len: int
    ratio: Interval | None = None
    far: Interval | None = None
    chance: float | None = None
    verdict: str | None = None
    why_not: str = ""  # the reason there is no verdict
    doubts: list[str] = field(default_factory=list)  # borderline: intervals spanning a threshold
    baseline: bool = False
    seeds: int = 1


def _label(scheme: str, method: str) -> str:
    return scheme if is_identity(method) else f"{scheme}+{method}"


def headline_task(retrieval: Sequence[dict]) -> str | None:
    """The headline task (:data:`HEADLINE_TASKS` order) among the tasks of ``retrieval``; None without one."""
    tasks = {r.get("task") for r in retrieval}
    return next((t for t in HEADLINE_TASKS if t in tasks), None)


def headline_length(records: Sequence[dict], retrieval: Sequence[dict], task: str) -> int | None:
    """The longest length with both a successful perplexity record and a retrieval record of ``task``."""
    ppl = {int(r["eval_len"]) for r in records if r.get("status", "ok") == "ok" and r.get("ppl") is not None}
    ret = {int(r["eval_len"]) for r in retrieval if r.get("task") == task}
    both = ppl & ret
    return max(both) if both else None


def _row(records, retrieval, scheme: str, method: str, n: int, task: str) -> HeadlineRow:
    mine = [r for r in retrieval if r.get("task") == task and r.get("scheme") == scheme
            and method_key(r.get("method")) == method]
    own = [int(r["train_len"]) for r in records if r.get("scheme") == scheme and r.get("train_len")
           and method_key(r.get("method")) == method]
    L = own[0] if own else int(mine[0]["train_len"])  # the model's own trained length (a fine-tune's is longer)
    row = HeadlineRow(scheme, method, _label(scheme, method), L, chance=mine[0].get("chance"))
    row.seeds = len({r.get("seed") for r in mine})
    far_cells = [r for r in mine if int(r["eval_len"]) == n and int(r["distance"]) > L]
    row.far = far_interval(far_cells) if far_cells else None
    row.ratio = ratio_interval(records, scheme, method, L, n) if n > L else None
    if n <= L:
        row.why_not = f"trained at L = {L} >= N"
    elif row.ratio is None:
        status = sorted({str(r.get("status")) for r in records if r.get("scheme") == scheme
                         and method_key(r.get("method")) == method and int(r["eval_len"]) == n} - {"ok"})
        row.why_not = f"no perplexity at N = {n}" + (f": {', '.join(status)}" if status else "")
    row.verdict = classify(row.ratio, row.far)
    if row.verdict is None and not row.why_not:
        row.why_not = f"no needles beyond L at N = {n}"
    row.doubts = borderline(row.ratio, row.far) if row.verdict else []
    return row


def headline(records: Sequence[dict], retrieval: Sequence[dict]) -> tuple[str | None, int | None, list[HeadlineRow]]:
    """``(task, N, rows)``: the headline task and length and one :class:`HeadlineRow` per row with that task's
    records (first-seen order); ``(None, None, [])`` without retrieval records."""
    task = headline_task(retrieval)
    n = headline_length(records, retrieval, task) if task else None
    if task is None or n is None:
        return task, n, []
    keys = list(dict.fromkeys((r["scheme"], method_key(r.get("method"))) for r in retrieval if r.get("task") == task))
    rows = [_row(records, retrieval, s, m, n, task) for s, m in keys]
    with_methods = {s for s, m in keys if not is_identity(m)} | {r["scheme"] for r in records
                                                               if not is_identity(r.get("method"))}
    for row in rows:
        row.baseline = is_identity(row.method) and row.scheme in with_methods
    return task, n, rows


# ------------------------------------------------------------------------------------------ text
def _fmt_iv(iv: Interval | None, digits: int = 2) -> str:
    if iv is None:
        return "-"
    s = f"{iv.value:.{digits}f}"
    return s + (f" [{iv.lo:.{digits}f}, {iv.hi:.{digits}f}]" if iv.known else "")


def _verdict_text(row: HeadlineRow) -> str:
    if row.verdict is None:
        return f"no verdict: {row.why_not}"
    text = row.verdict + ("?" if row.doubts else "")
    if row.baseline and row.verdict == FAILS:
        text += " (baseline: expected)"
    if row.verdict == FAILS and row.far is not None and row.far.value >= FAR_OK:
        text += ", though far needles are still found"
    return text


def _vs_baseline(row: HeadlineRow, base: HeadlineRow | None) -> str:
    if base is None or base is row or row.far is None or base.far is None:
        return ""
    if separated(row.far, base.far):
        side = "above" if row.far.value > base.far.value else "below"
        return f"far accuracy {side} {base.label} (intervals separate)"
    return f"far accuracy not separable from {base.label}"


def headline_markdown(records: Sequence[dict], retrieval: Sequence[dict], figure: str | None = None) -> str:
    """The verdict summary, the figure (``figure``: its file name), how to read it, and the table; "" without
    retrieval records."""
    task, n, rows = headline(records, retrieval)
    if not rows:
        return ""
    out = [f"At N = {n} tokens. Task: {TASK_SHORT.get(task, task)}. Thresholds: PPL(N)/PPL(L) <= {PPL_KEEP:g} and "
           f"accuracy on needles beyond L >= {FAR_OK:g}.", ""]
    for v, what in zip(VERDICTS, ("keeps perplexity and retrieves far needles", "keeps perplexity, loses far "
                                  "needles", f"perplexity not kept at {n} tokens")):
        names = [r.label + ("?" if r.doubts else "") + (" (baseline, expected)" if r.baseline and v == FAILS else "")
                 for r in rows if r.verdict == v]
        out.append(f"- **{v}** ({what}): {', '.join(names) if names else 'none'}")
    missing = [f"{r.label} ({r.why_not})" for r in rows if r.verdict is None]
    if missing:
        out.append(f"- **no verdict**: {'; '.join(missing)}")
    if any(r.doubts for r in rows):
        out.append("- `?`: borderline, an interval spans its threshold (see the table)")
    if figure:
        out += ["", f"![headline: far-needle accuracy vs perplexity ratio]({figure})"]
    out += ["", _reading(task, n, rows), "", _table(rows, n)]
    return "\n".join(out)


def _reading(task: str, n: int, rows: list[HeadlineRow]) -> str:
    seeds = max(r.seeds for r in rows)
    ppl_bar = (f"t interval across {seeds} seeds" if seeds > 1 else
               "one seed, so no interval is drawn for perplexity")
    return (f"N = {n} tokens is the longest length with both perplexity and retrieval. Task: "
            f"{TASK_LABELS.get(task, task)}. Thresholds: {thresholds_text()} Bars: Wilson 95% interval of the "
            f"far-needle accuracy (correct trials pooled over the needle distances beyond L and over seeds); "
            f"perplexity ratio: {ppl_bar}. A difference is called real only when the intervals separate.")


def _table(rows: list[HeadlineRow], n: int) -> str:
    base = {r.scheme: r for r in rows if r.baseline}
    out = [f"| scheme / method | L | PPL({n})/PPL(L) | far-needle accuracy [95%] | trials | verdict | vs baseline |",
           "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        trials = "-" if r.far is None else str(r.far.n)
        verdict = _verdict_text(r) + (f" ({'; '.join(r.doubts)})" if r.doubts else "")
        out.append(f"| {r.label} | {r.train_len} | {_fmt_iv(r.ratio)} | {_fmt_iv(r.far)} | {trials} | {verdict} | "
                   f"{_vs_baseline(r, base.get(r.scheme))} |")
    return "\n".join(out)


def baseline_checks(records: Sequence[dict], retrieval: Sequence[dict]) -> list[str]:
    """One line per baseline: ``expected ..., observed ...`` (a baseline that fails past L is as expected)."""
    _, n, rows = headline(records, retrieval)
    lines = []
    for r in rows:
        if r.baseline:
            seen = r.verdict or f"no verdict, {r.why_not}"
            ratio = f", PPL ratio {r.ratio.value:.2f}" if r.ratio is not None else ""
            status = "SKIP" if r.verdict is None else "PASS" if r.verdict == FAILS else "FAIL"
            lines.append(f"{status}: baseline {r.label} at {n} tokens: expected "
                         f"{FAILS} (no extension method), observed {seen}{ratio}")
    return lines


# ------------------------------------------------------------------------------------------ figure
def _regions(ax, x0: float, x1: float) -> None:
    """The three verdict regions, shaded and named, with the thresholds labelled."""
    from matplotlib.patches import Rectangle

    y0, y1 = -0.04, 1.06
    for (xa, xb, ya, yb), colour in (((x0, PPL_KEEP, FAR_OK, y1), "#b8e0b0"), ((x0, PPL_KEEP, y0, FAR_OK), "#f6e3a8"),
                                     ((PPL_KEEP, x1, y0, y1), "#dcdcdc")):
        ax.add_patch(Rectangle((xa, ya), xb - xa, yb - ya, color=colour, alpha=0.55, zorder=0, linewidth=0))
    mid = (x0 * PPL_KEEP) ** 0.5  # the middle of the kept band on the log axis
    for x, y, va, name in ((mid, FAR_OK + 0.03, "bottom", "EXTENDS"), (mid, FAR_OK - 0.03, "top", "LOCAL ONLY"),
                           ((PPL_KEEP * x1) ** 0.5, 0.62, "center", "FAILS")):
        ax.text(x, y, name, fontsize=13, weight="bold", color="#4a4a4a", ha="center", va=va, zorder=1)
    ax.axvline(PPL_KEEP, color="#444444", linewidth=1.0, zorder=1)
    ax.axhline(FAR_OK, color="#444444", linewidth=1.0, zorder=1)
    ax.text(PPL_KEEP * 1.01, y1 - 0.01, f"PPL ratio = {PPL_KEEP:g}", fontsize=8, va="top", zorder=1)
    ax.text(x1 / 1.01, FAR_OK + 0.01, f"far accuracy = {FAR_OK:g}", fontsize=8, ha="right", va="bottom", zorder=1)
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)


def _place_labels(fig, ax, points: list[tuple[float, float, str]]) -> None:
    """Label points where the label overlaps no other label (the rest are named in the legend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    placed, frame = [], ax.get_window_extent(renderer)
    for x, y, text in points:
        for dx, dy, ha in ((7, 3, "left"), (7, -11, "left"), (-7, 3, "right"), (-7, -11, "right"), (7, 13, "left")):
            t = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=7, ha=ha,
                            annotation_clip=True, zorder=5)
            t.set_in_layout(False)
            box = t.get_window_extent(renderer)
            if frame.contains(box.x0, box.y0) and frame.contains(box.x1, box.y1) and \
                    not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            t.remove()


def _point_style(ax, r: HeadlineRow, style: dict, cap: float) -> float:
    """Draw one point with its bars; a ratio beyond ``cap`` sits at the edge. Returns the x drawn at."""
    y, x = r.far, r.ratio
    at = min(x.value, cap / 1.04)
    xerr = [[x.value - x.lo], [min(x.hi, cap) - x.value]] if x.known and x.value <= cap else None
    ax.errorbar(at, y.value, yerr=[[y.value - y.lo], [y.hi - y.value]], xerr=xerr, fmt=style["marker"],
                color=style["color"], ms=7, capsize=2, elinewidth=1, zorder=3,
                markeredgecolor="black" if r.baseline else style["color"])
    return at


def plot_headline(records: Sequence[dict], retrieval: Sequence[dict], path,
                  finetunes: Sequence[str] = ()) -> Path | None:
    """The headline figure (module docstring); None (nothing written) without points to draw. Ratios beyond
    :data:`X_CAP` are drawn at the right edge, their value in the label."""
    from matplotlib.lines import Line2D

    task, n, rows = headline(records, retrieval)
    pts = [r for r in rows if r.ratio is not None and r.far is not None]
    if not pts:
        return None
    colours = palette([(r.scheme, r.method) for r in pts], finetunes)
    fig, (ax,) = new_figure(11.0, 6.0)
    ax.set_xscale("log")
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    lo = min(min(r.ratio.lo if r.ratio.known else r.ratio.value for r in pts), 0.9) * 0.92
    hi = min(max(max(r.ratio.hi if r.ratio.known else r.ratio.value for r in pts), 2.0) * 1.12, X_CAP)
    _regions(ax, lo, hi)
    ax.xaxis.set_major_locator(FixedLocator([t for t in (0.5, 0.75, 1, PPL_KEEP, 2, 3, 4, 6) if lo <= t <= hi]))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    handles: dict[str, list] = {fam: [] for fam in FAMILIES}
    labels = []
    for r in sorted(pts, key=lambda r: (not r.baseline, r.verdict != FAILS)):
        style = colours[(r.scheme, r.method)]
        at = _point_style(ax, r, style, hi)
        labels.append((at, r.far.value, r.label + (f" ({r.ratio.value:.3g}x)" if r.ratio.value > hi else "")))
    for r in pts:
        style = colours[(r.scheme, r.method)]
        handles[style["family"]].append(Line2D([], [], linestyle="none", marker=style["marker"], color=style["color"],
                                               label=r.label + (" (baseline)" if r.baseline else "")))
    chance = next((r.chance for r in pts if isinstance(r.chance, (int, float))), None)
    if chance is not None:
        ax.axhline(chance, color="#aa0000", linestyle=":", linewidth=1, zorder=1)
        ax.text(PPL_KEEP * 1.01, chance + 0.008, "chance", fontsize=7, color="#aa0000", va="bottom")
    legend = []
    for fam, hs in handles.items():
        if hs:
            legend += [Line2D([], [], linestyle="none", label=f"{fam}:")] + hs
    ncol = 2 if len(legend) > 26 else 1
    while ncol == 2 and legend[(len(legend) + 1) // 2 - 1].get_label().endswith(":"):  # no family name ends a column
        legend.insert((len(legend) + 1) // 2 - 1, Line2D([], [], linestyle="none", label=" "))
    ax.legend(handles=legend, fontsize=7, ncol=ncol, loc="center left",
              bbox_to_anchor=(1.01, 0.5), handletextpad=0.3, columnspacing=0.8, title="colour = family")
    edge = f"; beyond {hi:.3g}: drawn at the edge" if any(r.ratio.value > hi for r in pts) else ""
    ax.set_xlabel(f"perplexity ratio PPL({n}) / PPL(L)   (log scale; left of {PPL_KEEP:g}: perplexity kept{edge})")
    ax.set_ylabel(f"accuracy on needles beyond L at {n} tokens")
    ax.set_title(f"Which methods use the context past the trained length L? ({task}, N = {n} tokens)", fontsize=10)
    _place_labels(fig, ax, labels)
    return save_png(fig, path, dpi=100, make_dirs=True)
