"""Reports of a length-extrapolation bench: the headline first, then tables, checks and plots.

Input is ``results.json`` (written by :func:`posenc.evals.lab.bench.run_bench`): ``records``, one per (trained scheme,
inference-time method, eval length[, seed]) with keys ``scheme``, ``method``, ``train_len``, ``eval_len``, ``ppl``,
``loss``, ``accuracy``, ``tokens``, ``passkey``, ``status``, ``note``; and ``retrieval``
(:class:`posenc.evals.records.RetrievalRecord` rows). A record's ``method`` is ``None``/``"none"`` for the model as
trained; otherwise the training-free method applied to the trained weights (e.g. ``yarn`` on the RoPE model,
``hierarchical`` on the learned model). Several seeds of a cell are pooled first (:mod:`posenc.evals.stats.pooling`).

The document, top to bottom:

- the headline (:mod:`posenc.evals.report.headline`): which rows extend past the trained length, which only look
  locally, which fail (:mod:`posenc.evals.stats.verdict`), as a list and as one figure with intervals;
- :func:`markdown_tables`: rows = scheme/method, columns = eval lengths, cells ``ppl / acc%``; a second
  table with the ratio PPL(8L)/PPL(L) (the train-short / test-long degradation of ALiBi, arXiv:2108.12409,
  Table 2) and passkey retrieval accuracy (Landmark Attention's task, arXiv:2305.16300);
- the checks: :func:`shape_checks` (the shapes the literature predicts, PASS/FAIL/SKIP lines), the retrieval
  checks and the baselines' lines, shown as expected / observed (:func:`posenc.evals.report.doc.check_items`);
- :func:`plot_ppl`, :func:`plot_accuracy`, :func:`plot_passkey` and the retrieval heatmaps (matplotlib, Agg, no
  pyplot state; colours by method family, :mod:`posenc.evals.report.families`);
- the machine and timings, folded in a ``<details>`` block.

:func:`write_report` writes ``report.md``, a self-contained ``report.html`` (PNGs embedded as base64) and the PNGs.
``posenc eval``'s report has its own template (:mod:`posenc.evals.report.evaluation`). CLI-free on purpose (``posenc
bench`` calls it); ``python -m posenc.evals.report.lab RESULTS.json [OUT_DIR]`` re-renders.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from posenc._figures import new_figure, save_png
from posenc.evals.records import REQUIRED_KEYS, RETRIEVAL_TASKS
from posenc.evals.report.doc import check_items, checks_md, details_md, md_to_html, page
from posenc.evals.report.families import palette
from posenc.evals.report.headline import TASK_LABELS, baseline_checks, headline_markdown, plot_headline
from posenc.evals.report.retrieval import plot_retrieval, retrieval_checks
from posenc.evals.stats.pooling import pool_records, pool_retrieval
from posenc.methods import is_identity
from posenc.runtime.atomic import atomic_write_text

__all__ = ["REQUIRED_KEYS", "is_trained", "row_label", "rows", "markdown_tables", "shape_checks",
           "plot_ppl", "plot_accuracy", "plot_passkey", "render_markdown", "render_html", "write_report"]

# thresholds of the expected shapes (issue "The extrapolation lab")
DEGRADE_MIN = 2.0   # sinusoidal and plain RoPE: PPL(8L) >= 2 x PPL(L)
ALIBI_MAX = 1.2     # ALiBi holds: PPL(8L) <= 1.2 x PPL(L)
EXTEND_MAX = 1.5    # at least one training-free RoPE extension: PPL(8L) <= 1.5 x PPL(L)
TARGET_FACTOR = 8


# ------------------------------------------------------------------------------------------ helpers
def is_trained(rec: dict) -> bool:
    """True for the model as trained (no inference-time method)."""
    return is_identity(rec.get("method"))


def row_label(scheme: str, method) -> str:
    """``scheme`` for a trained model, ``scheme+method`` for a method applied to it."""
    return scheme if is_identity(method) else f"{scheme}+{method}"


def _ok(rec: dict) -> bool:
    ppl = rec.get("ppl")
    return rec.get("status", "ok") == "ok" and isinstance(ppl, (int, float)) and math.isfinite(ppl)


def rows(records: Sequence[dict]) -> dict[tuple[str, str | None], dict[int, dict]]:
    """``{(scheme, method): {eval_len: record}}`` in first-seen order (trained rows before method rows of
    the same scheme as the bench writes them); several seeds of a cell pooled (:func:`pool_records`)."""
    out: dict[tuple[str, str | None], dict[int, dict]] = {}
    for r in pool_records(records):
        method = None if is_identity(r.get("method")) else r["method"]
        out.setdefault((r["scheme"], method), {})[int(r["eval_len"])] = r
    return out


def _lengths(records: Sequence[dict]) -> list[int]:
    return sorted({int(r["eval_len"]) for r in records})


def _train_len(cells: dict[int, dict]) -> int | None:
    for r in cells.values():
        if r.get("train_len"):
            return int(r["train_len"])
    return None


def ratio(cells: dict[int, dict], factor: int = TARGET_FACTOR) -> float | None:
    """PPL(factor * L) / PPL(L) of one row, or None when either cell is missing or failed."""
    L = _train_len(cells)
    if L is None:
        return None
    a, b = cells.get(L), cells.get(factor * L)
    if a is None or b is None or not (_ok(a) and _ok(b)):
        return None
    return float(b["ppl"]) / float(a["ppl"])


def passkey_cells(rec_or_value) -> list[dict]:
    """Normalise a record's ``passkey`` field to a list of ``{length, depth, accuracy}`` cells.

    Accepts None, a number (mean accuracy; depth unknown -> NaN), a list of cells, or a dict with
    ``cells`` (the output of :func:`posenc.tasks.passkey.run_passkey`) or ``accuracy``."""
    p = rec_or_value.get("passkey") if isinstance(rec_or_value, dict) and "scheme" in rec_or_value else rec_or_value
    length = rec_or_value.get("eval_len") if isinstance(rec_or_value, dict) and "scheme" in rec_or_value else None
    if p is None:
        return []
    if isinstance(p, (int, float)):
        return [{"length": length, "depth": float("nan"), "accuracy": float(p)}]
    if isinstance(p, dict):
        if "cells" in p:
            return [dict(c) for c in p["cells"]]
        if "accuracy" in p:
            return [{"length": p.get("length", length), "depth": p.get("depth", float("nan")),
                     "accuracy": float(p["accuracy"])}]
        return []
    return [dict(c) for c in p if isinstance(c, dict) and "accuracy" in c]


def _row_passkey(cells: dict[int, dict]) -> list[dict]:
    out, seen = [], set()
    for r in cells.values():
        for c in passkey_cells(r):
            key = (c.get("length"), c.get("depth"))
            if key not in seen:
                seen.add(key)
                out.append(c)
    return out


def _fmt_ppl(x) -> str:
    if x is None or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "-"
    return f"{x:.3g}" if x < 1000 else f"{x:.3e}"


def _fmt_cell(r: dict | None) -> str:
    if r is None:
        return ""
    if not _ok(r):
        return r.get("status") or "n/a"
    acc = r.get("accuracy")
    acc_s = f"{100 * acc:.1f}%" if isinstance(acc, (int, float)) and math.isfinite(acc) else "-"
    lo, hi = ppl_bounds(r)
    iv = f" [{_fmt_ppl(lo)}, {_fmt_ppl(hi)}]" if lo is not None and hi is not None else ""
    return f"{_fmt_ppl(r['ppl'])}{iv} / {acc_s}"


def ppl_bounds(r: dict) -> tuple[float | None, float | None]:
    """The 95% interval of a cell's perplexity: across seeds for a pooled cell (``ppl_interval``, Student's t over
    the seeds' losses), else over the windows of its one run (``ppl_lo``/``ppl_hi``); ``(None, None)`` when
    neither is known."""
    iv = r.get("ppl_interval")
    if isinstance(iv, dict) and iv.get("lo") is not None and iv.get("hi") is not None:
        return float(iv["lo"]), float(iv["hi"])
    lo, hi = r.get("ppl_lo"), r.get("ppl_hi")
    return (float(lo), float(hi)) if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) else (None, None)


# ------------------------------------------------------------------------------------------ tables
def markdown_tables(records: Sequence[dict]) -> str:
    """Two Markdown tables: ``ppl / accuracy`` per eval length, then PPL(8L)/PPL(L) and passkey."""
    lengths = _lengths(records)
    table = rows(records)
    Ls = {_train_len(c) for c in table.values()} - {None}
    L = Ls.pop() if len(Ls) == 1 else None

    def head(n: int) -> str:
        if L and n % L == 0:
            return f"{n} ({n // L}L)"
        return str(n)

    out = ["| scheme / method | " + " | ".join(head(n) for n in lengths) + " |",
           "|---|" + "---:|" * len(lengths)]
    for (scheme, method), cells in table.items():
        out.append(f"| {row_label(scheme, method)} | " + " | ".join(_fmt_cell(cells.get(n)) for n in lengths)
                   + " |")
    out += ["", "Cells: perplexity [95% interval: across seeds where a row has several, else over the scored "
            "windows] / next-token top-1 accuracy.", ""]
    has_pk = any(_row_passkey(cells) for cells in table.values())
    out += [f"| scheme / method | PPL({TARGET_FACTOR}L)/PPL(L) |" + (" passkey exact match (digit accuracy) |"
                                                                     if has_pk else "") + " notes |",
            "|---|---:|" + ("---:|" if has_pk else "") + "---|"]
    for (scheme, method), cells in table.items():
        r = ratio(cells)
        pk = _row_passkey(cells)
        pk_s = "-"
        if pk:
            pk_s = f"{100 * sum(c['accuracy'] for c in pk) / len(pk):.0f}% ({len(pk)} cells)"
            digits = [c["digit_accuracy"] for c in pk if isinstance(c.get("digit_accuracy"), (int, float))]
            if digits:
                pk_s += f", digits {100 * sum(digits) / len(digits):.0f}%"
        notes = sorted({str(c.get("note")) for c in cells.values() if c.get("note")})
        if notes:
            first = notes[0] if len(notes[0]) <= 100 else notes[0][:99] + "…"
            notes = first + (f" (+{len(notes) - 1} similar)" if len(notes) > 1 else "")
        else:
            notes = ""
        pk_col = f" {pk_s} |" if has_pk else ""
        out.append(f"| {row_label(scheme, method)} | {'-' if r is None else f'{r:.2f}'} |{pk_col} "
                   f"{notes.replace('|', '/')} |")
    return "\n".join(out)


def shape_checks(records: Sequence[dict]) -> list[str]:
    """The issue's expected shapes, one ``PASS``/``FAIL``/``SKIP`` line each (SKIP: data missing).

    1. sinusoidal degrades beyond L: PPL(8L) >= 2 x PPL(L);
    2. plain RoPE degrades beyond L: PPL(8L) >= 2 x PPL(L);
    3. ALiBi holds: PPL(8L) <= 1.2 x PPL(L);
    4. at least one training-free extension on the RoPE model holds: PPL(8L) <= 1.5 x PPL(L).
    """
    table = rows(records)
    lines = []

    def trained(name: str, test, want: str, title: str) -> None:
        cells = table.get((name, None))
        r = ratio(cells) if cells else None
        if r is None:
            lines.append(f"SKIP: {title}: no {name} PPL at L and {TARGET_FACTOR}L")
        else:
            lines.append(f"{'PASS' if test(r) else 'FAIL'}: {title}: PPL({TARGET_FACTOR}L)/PPL(L) = {r:.2f} "
                         f"(expected {want})")

    trained("sinusoidal", lambda r: r >= DEGRADE_MIN, f">= {DEGRADE_MIN:g}", "sinusoidal degrades beyond L")
    trained("rope", lambda r: r >= DEGRADE_MIN, f">= {DEGRADE_MIN:g}", "plain RoPE degrades beyond L")
    trained("alibi", lambda r: r <= ALIBI_MAX, f"<= {ALIBI_MAX:g}", "ALiBi holds")
    ext = {m: ratio(c) for (s, m), c in table.items() if s == "rope" and m is not None}
    ext = {m: r for m, r in ext.items() if r is not None}
    if not ext:
        lines.append(f"SKIP: a training-free RoPE extension holds: no method rows at L and {TARGET_FACTOR}L")
    else:
        best = sorted(ext.items(), key=lambda kv: kv[1])
        held = [f"{m} {r:.2f}" for m, r in best if r <= EXTEND_MAX]
        shown = ", ".join(held) if held else ", ".join(f"{m} {r:.2f}" for m, r in best[:3])
        lines.append(f"{'PASS' if held else 'FAIL'}: a training-free RoPE extension holds "
                     f"(PPL({TARGET_FACTOR}L)/PPL(L) <= {EXTEND_MAX:g}): "
                     f"{'held: ' if held else 'none held; best: '}{shown}")
    return lines


# ------------------------------------------------------------------------------------------ plots
def _style(colour: dict, trained: bool) -> dict:
    return {"color": colour["color"], "linestyle": "-" if trained else "--", "marker": colour["marker"],
            "markersize": 5 if trained else 4, "linewidth": 2.0 if trained else 1.2}


def _plot_metric(records: Sequence[dict], path, key: str, ylabel: str, log_y: bool, finetunes=()) -> Path:
    fig, (ax,) = new_figure(9.0, 5.5)
    table = rows(records)
    colours = palette(table, finetunes)
    n_lines = 0
    Ls = set()
    for (scheme, method), cells in table.items():
        pts = sorted((n, float(r[key])) for n, r in cells.items() if _ok(r) and isinstance(r.get(key), (int, float)))
        if not pts:
            continue
        Ls.add(_train_len(cells))
        n_lines += 1
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=row_label(scheme, method),
                **_style(colours[(scheme, method)], method is None))
    for L in Ls - {None}:
        ax.axvline(L, color="gray", linewidth=0.8, linestyle=":")
    from matplotlib.ticker import FixedLocator, LogLocator, NullFormatter, NullLocator, ScalarFormatter

    ax.set_xscale("log", base=2)
    lengths = _lengths(records)
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("evaluation length (tokens; dotted: train length L)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if n_lines:
        ax.legend(fontsize=7, ncol=2 if n_lines > 12 else 1, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(f"{ylabel} vs length (colour: family; solid: trained; dashed: a method)", fontsize=9)
    return save_png(fig, path, dpi=100, make_dirs=True)


def plot_ppl(records: Sequence[dict], path, finetunes: Sequence[str] = ()) -> Path:
    """Perplexity vs eval length on log-log axes; one line per scheme/method, coloured by method family
    (:func:`posenc.evals.report.families.palette`; ``finetunes``: the bench's fine-tuned scheme names)."""
    return _plot_metric(records, path, "ppl", "perplexity", log_y=True, finetunes=finetunes)


def plot_accuracy(records: Sequence[dict], path, finetunes: Sequence[str] = ()) -> Path:
    """Next-token top-1 accuracy vs eval length (log x), coloured as :func:`plot_ppl`."""
    return _plot_metric(records, path, "accuracy", "next-token accuracy", log_y=False, finetunes=finetunes)


def plot_passkey(records: Sequence[dict], path) -> Path | None:
    """One heatmap (length x depth, colour = exact-match accuracy, text also digit accuracy ``d``) per
    scheme/method that has passkey cells.
    Returns None (and writes nothing) when no record has passkey results."""
    import numpy as np

    panels = [(row_label(s, m), _row_passkey(c)) for (s, m), c in rows(records).items()]
    panels = [(name, cells) for name, cells in panels if cells]
    if not panels:
        return None
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = new_figure(3.2 * ncols, 2.6 * nrows + 0.4, nrows, ncols)
    im = None
    for ax, (name, cells) in zip(axes, panels):
        lengths = sorted({c["length"] for c in cells if c.get("length") is not None})
        depths = sorted({float(c["depth"]) for c in cells}, key=lambda d: (math.isnan(d), d))
        grid = np.full((len(depths), max(1, len(lengths))), np.nan)
        digit = np.full_like(grid, np.nan)
        for c in cells:
            if c.get("length") is None:
                continue
            d = float(c["depth"])
            i = next(k for k, v in enumerate(depths) if v == d or (math.isnan(v) and math.isnan(d)))
            grid[i, lengths.index(c["length"])] = c["accuracy"]
            if isinstance(c.get("digit_accuracy"), (int, float)):
                digit[i, lengths.index(c["length"])] = c["digit_accuracy"]
        im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), ["?" if math.isnan(d) else f"{d:.2f}" for d in depths], fontsize=7)
        ax.set_title(name, fontsize=8)
        ax.set_xlabel("length", fontsize=7)
        ax.set_ylabel("depth", fontsize=7)
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                label = f"{v:.0%}" if np.isnan(digit[i, j]) else f"{v:.0%}\nd {digit[i, j]:.0%}"
                ax.text(j, i, label, ha="center", va="center", fontsize=6,
                        color="white" if v < 0.5 else "black")
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if im is not None:
        fig.colorbar(im, ax=list(axes[:len(panels)]), shrink=0.8, label="passkey exact-match accuracy")
    return save_png(fig, path, dpi=100, make_dirs=True)


# ------------------------------------------------------------------------------------------ documents
def finetune_names(meta: dict) -> list[str]:
    """The fine-tuned scheme names of a bench (``meta.config.finetunes``)."""
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    return [f["name"] for f in config.get("finetunes", []) if isinstance(f, dict) and "name" in f]


def _summary(meta: dict, records: Sequence[dict]) -> str:
    Ls = sorted({int(r["train_len"]) for r in records if r.get("train_len")})
    lengths = _lengths(records)
    parts = [f"Preset `{meta.get('preset', '?')}`"]
    if meta.get("corpus"):
        parts.append(f"on `{meta['corpus']}`" + (f" ({meta['tokenizer']} tokenizer)" if meta.get("tokenizer") else ""))
    text = " ".join(parts)
    if Ls and lengths:
        text += f": trained at L = {', '.join(map(str, Ls))}, evaluated at {', '.join(map(str, lengths))} tokens"
    return text + "."


def _checks(records: Sequence[dict], retrieval: Sequence[dict]) -> list[str]:
    return shape_checks(records) + (retrieval_checks(retrieval) + baseline_checks(records, retrieval)
                                    if retrieval else [])


def render_markdown(results: dict, images: Sequence[str | Path] = ()) -> str:
    """``report.md``: the headline first (verdicts, ``headline.png`` when among ``images``, the table), then the
    per-length tables, the checks (expected / observed), the other plots, and the machine and timings folded."""
    meta, raw = results.get("meta", {}), results.get("records", [])
    raw_retrieval = results.get("retrieval", [])
    records, retrieval = pool_records(raw), pool_retrieval(raw_retrieval)
    names = [Path(p).name for p in images]
    out = [f"# posenc bench: {meta.get('preset', '?')}", "", _summary(meta, records), "",
           "## Which methods extend past the trained length?", ""]
    head = headline_markdown(raw, raw_retrieval, "headline.png" if "headline.png" in names else None)
    out.append(head or "No retrieval records: these results cannot tell a method that extends the context from "
               "one that only looks locally (perplexity alone is below).")
    out += ["", "## Perplexity / accuracy vs evaluation length", "", markdown_tables(records), "",
            "## Checks against the literature: expected and observed", "", checks_md(_checks(records, retrieval))]
    rest = [n for n in names if n != "headline.png"]
    if rest:
        out += ["", "## Plots"]
        for n in rest:
            task = Path(n).stem.removeprefix("retrieval_") if Path(n).stem.startswith("retrieval_") else None
            out += [""] + ([f"Accuracy by needle distance and length: {TASK_LABELS.get(task, task)}.", ""]
                           if task else []) + [f"![{Path(n).stem}]({n})"]
    details = details_md(meta)
    if details:
        out += ["", "## Machine and timings", "", details]
    return "\n".join(out) + "\n"


def render_html(results: dict, images: Sequence[str | Path] = ()) -> str:
    """Self-contained ``report.html``: :func:`render_markdown`'s document, PNGs embedded as base64 data URIs."""
    meta = results.get("meta", {})
    md = render_markdown(results, images)
    checks = _checks(pool_records(results.get("records", [])), pool_retrieval(results.get("retrieval", [])))
    body = md_to_html(md, {Path(p).name: Path(p) for p in images}, [c for c, _ in check_items(checks)])
    return page(f"posenc bench {meta.get('preset', '')}", body)


def write_report(results: dict, out_dir) -> dict[str, Path]:
    """Write a bench's report into ``out_dir``; returns name -> path. (``posenc eval``'s report is
    :func:`posenc.evals.report.evaluation.write_eval_report`.)

    Writes ``headline.png`` (when ``results["retrieval"]`` has records), ``ppl_vs_length.png``,
    ``accuracy_vs_length.png``, ``passkey.png`` (records with passkey cells), ``retrieval_<task>.png`` per retrieval
    task, ``report.md`` and ``report.html``."""
    meta = results.get("meta", {})
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw, raw_retrieval = results.get("records", []), results.get("retrieval", [])
    records, retrieval = pool_records(raw), pool_retrieval(raw_retrieval)
    finetunes = finetune_names(meta)
    paths: dict[str, Path] = {}
    hl = plot_headline(raw, raw_retrieval, out_dir / "headline.png", finetunes)
    if hl is not None:
        paths["headline_plot"] = hl
    paths["ppl_plot"] = plot_ppl(records, out_dir / "ppl_vs_length.png", finetunes)
    paths["accuracy_plot"] = plot_accuracy(records, out_dir / "accuracy_vs_length.png", finetunes)
    pk = plot_passkey(records, out_dir / "passkey.png")
    if pk is not None:
        paths["passkey_plot"] = pk
    for task in RETRIEVAL_TASKS:
        rt = plot_retrieval(retrieval, out_dir / f"retrieval_{task}.png", task)
        if rt is not None:
            paths[f"retrieval_{task}_plot"] = rt
    images = [p for k, p in paths.items() if k.endswith("_plot")]
    paths["markdown"] = atomic_write_text(out_dir / "report.md", render_markdown(results, images))
    paths["html"] = atomic_write_text(out_dir / "report.html", render_html(results, images))
    return paths


def main(argv=None) -> int:
    """``python -m posenc.evals.report.lab RESULTS.json [OUT_DIR]``: re-render a bench's report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m posenc.evals.report.lab RESULTS.json [OUT_DIR]", file=sys.stderr)
        return 2
    src = Path(argv[0])
    results = json.loads(src.read_text())
    if results.get("meta", {}).get("command") == "posenc eval":
        print(f"{src} holds `posenc eval` results: python -m posenc.evals.report.evaluation {src} [OUT_DIR]",
              file=sys.stderr)
        return 2
    paths = write_report(results, argv[1] if len(argv) > 1 else src.parent)
    records = pool_records(results.get("records", []))
    print(markdown_tables(records))
    print("\n".join(_checks(records, pool_retrieval(results.get("retrieval", [])))))
    print(f"wrote {paths['markdown']} and {paths['html']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
