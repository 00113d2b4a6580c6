"""The report of ``posenc eval --out DIR``: just the evaluated rows.

Not a bench, so none of the bench's parts: no expected-shape checks (they name schemes a single evaluation does not
have) and no headline (no retrieval probe). One table, one row per (scheme, method) evaluated, with only the
columns that have data: a length column where some row succeeded, the model's trained length, the perplexity ratio
to the trained length, passkey and notes only when some row has them; a length at which every row failed is named
under the table instead of being an empty column. Then the perplexity and accuracy plots (two lengths or more) and
the run's details folded.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from posenc.evals.report.doc import details_md, md_to_html, page
from posenc.evals.report.lab import _fmt_cell, _ok, _row_passkey, plot_accuracy, plot_passkey, plot_ppl, row_label, rows
from posenc.evals.stats.pooling import pool_records
from posenc.runtime.atomic import atomic_write_text

__all__ = ["eval_table", "main", "render_eval_markdown", "write_eval_report"]


def _ratio(cells: dict[int, dict]) -> str:
    """PPL(longest ok length)/PPL(L) of a row with a trained length ``L`` among its lengths, else ""."""
    L = next((int(r["train_len"]) for r in cells.values() if r.get("train_len")), None)
    ok = sorted(n for n, r in cells.items() if _ok(r))
    if L is None or L not in ok or ok[-1] <= L:
        return ""
    return f"{ok[-1] // L if ok[-1] % L == 0 else round(ok[-1] / L, 2)}L: " \
           f"{float(cells[ok[-1]]['ppl']) / float(cells[L]['ppl']):.2f}"


def _passkey(cells: dict[int, dict]) -> str:
    pk = _row_passkey(cells)
    return f"{100 * sum(c['accuracy'] for c in pk) / len(pk):.0f}% ({len(pk)} cells)" if pk else ""


def eval_table(records: Sequence[dict]) -> tuple[str, list[int]]:
    """``(markdown table, lengths dropped)``: one row per (scheme, method), columns with no data left out."""
    table = rows(records)
    lengths = sorted({int(r["eval_len"]) for r in records})
    kept = [n for n in lengths if any(_ok(c[n]) for c in table.values() if n in c)]
    cols: dict[str, list[str]] = {"scheme / method": [row_label(s, m) for s, m in table]}
    cols["L"] = [str(next((r["train_len"] for r in c.values() if r.get("train_len")), "")) for c in table.values()]
    for n in kept:
        cols[str(n)] = [_fmt_cell(c.get(n)) if c.get(n) is None or _ok(c[n]) else str(c[n].get("status"))
                        for c in table.values()]
    cols["PPL(longest)/PPL(L)"] = [_ratio(c) for c in table.values()]
    cols["passkey"] = [_passkey(c) for c in table.values()]
    cols["notes"] = ["; ".join(f"{n}: {str(r['note'])[:100]}" for n, r in sorted(c.items()) if r.get("note"))
                     .replace("|", "/") for c in table.values()]
    cols = {k: v for k, v in cols.items() if k == "scheme / method" or any(x not in ("", "-") for x in v)}
    out = ["| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]
    out += ["| " + " | ".join(col[i] for col in cols.values()) + " |" for i in range(len(table))]
    return "\n".join(out), [n for n in lengths if n not in kept]


def render_eval_markdown(results: dict, images: Sequence[str | Path] = ()) -> str:
    """``report.md`` of an evaluation: title, the table, the plots, the details folded."""
    meta, records = results.get("meta", {}), pool_records(results.get("records", []))
    out = [f"# posenc eval: {meta.get('source', '?')}", ""]
    if records:
        table, dropped = eval_table(records)
        out += [table, "", "Cells: perplexity / next-token top-1 accuracy."]
        if dropped:
            out.append(f"No row succeeded at {', '.join(map(str, dropped))} tokens (see the notes).")
    else:
        out.append("No records.")
    if images:
        out += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in images]
    details = details_md(meta, ("command", "lengths", "methods", "machine", "timings"))
    if details:
        out += ["", details]
    return "\n".join(out) + "\n"


def write_eval_report(results: dict, out_dir) -> dict[str, Path]:
    """``report.md``, ``report.html`` and, with two lengths or more, ``ppl_vs_length.png`` and
    ``accuracy_vs_length.png`` (``passkey.png`` with passkey cells) into ``out_dir``; returns name -> path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = pool_records(results.get("records", []))
    paths: dict[str, Path] = {}
    if len({int(r["eval_len"]) for r in records if _ok(r)}) > 1:
        paths["ppl_plot"] = plot_ppl(records, out_dir / "ppl_vs_length.png")
        if any(isinstance(r.get("accuracy"), (int, float)) and math.isfinite(r["accuracy"]) for r in records):
            paths["accuracy_plot"] = plot_accuracy(records, out_dir / "accuracy_vs_length.png")
    pk = plot_passkey(records, out_dir / "passkey.png")
    if pk is not None:
        paths["passkey_plot"] = pk
    images = list(paths.values())
    md = render_eval_markdown(results, images)
    paths["markdown"] = atomic_write_text(out_dir / "report.md", md)
    body = md_to_html(md, {p.name: p for p in images})
    title = f"posenc eval {results.get('meta', {}).get('source', '')}"
    paths["html"] = atomic_write_text(out_dir / "report.html", page(title, body))
    return paths


def main(argv=None) -> int:
    """``python -m posenc.evals.report.evaluation RESULTS.json [OUT_DIR]``: re-render an evaluation's report."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m posenc.evals.report.evaluation RESULTS.json [OUT_DIR]", file=sys.stderr)
        return 2
    src = Path(argv[0])
    paths = write_eval_report(json.loads(src.read_text()), argv[1] if len(argv) > 1 else src.parent)
    print(f"wrote {paths['markdown']} and {paths['html']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
