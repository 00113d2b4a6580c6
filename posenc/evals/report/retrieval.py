"""The retrieval half of a bench report: which methods really use the long context.

Input is ``results.json["retrieval"]`` (:class:`posenc.evals.records.RetrievalRecord` rows: ``task``,
``scheme``, ``method``, ``train_len``, ``eval_len``, ``distance``, ``accuracy``, ``n``, ``chance``) next
to the perplexity ``records``.

- :func:`plot_retrieval`: one heatmap per scheme/method, accuracy over (needle distance, evaluation length).
- :func:`ppl_vs_retrieval_table`: the headline table. Per row: perplexity at ``L`` and ``4L``, recall
  at ``L``, and recall at ``4L`` split into needles within ``L`` ("near") and beyond ``L`` ("far"),
  with the verdict of :mod:`posenc.evals.stats.verdict` (perplexity kept *and* far needles retrieved; a method
  that keeps perplexity but loses far needles only looks locally).
- :func:`retrieval_checks`: the probe's expected shapes as PASS/FAIL/SKIP lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from posenc._figures import new_figure, save_png
from posenc.evals.stats.pooling import pool_records, pool_retrieval
from posenc.evals.stats.verdict import EXTENDS, FAR_OK, LOCAL, classify
from posenc.methods import UnknownMethodError, is_identity, parse_methods

__all__ = ["FAR_FACTOR", "cells", "far_near", "plot_retrieval", "ppl_vs_retrieval_table", "retrieval_checks"]

FAR_FACTOR = 4  # the headline columns are at 4L
RETRIEVES_AT_L = 0.9  # plain RoPE retrieves at L: mean accuracy >= this
FAILS_BELOW = 0.5  # "fails" at 4L: mean accuracy below this
NEAR_OK = 0.8  # a windowed method answers needles within half its window
CHANCE_MARGIN = 0.1  # "near chance": accuracy <= chance + this
EXTENSION_OK = 0.8  # the best training-free extension keeps this mean accuracy at 4L


def _label(scheme: str, method) -> str:
    return scheme if is_identity(method) else f"{scheme}+{method}"


def cells(retrieval: Sequence[dict], task: str = "recall") -> dict[tuple[str, str], dict[tuple[int, int], dict]]:
    """``{(scheme, method): {(eval_len, distance): record}}`` of one task, in first-seen order; the trials of several
    seeds pooled (:func:`posenc.evals.stats.pooling.pool_retrieval`)."""
    out: dict[tuple[str, str], dict[tuple[int, int], dict]] = {}
    for r in pool_retrieval(retrieval):
        if r.get("task") == task:
            method = "none" if is_identity(r.get("method")) else r["method"]
            out.setdefault((r["scheme"], method), {})[(int(r["eval_len"]), int(r["distance"]))] = r
    return out


def _mean(rs: list[dict]) -> float | None:
    return sum(float(r["accuracy"]) for r in rs) / len(rs) if rs else None


def far_near(row: dict[tuple[int, int], dict], eval_len: int) -> tuple[float | None, float | None, float | None]:
    """Mean accuracy at ``eval_len`` over all distances, over needles within the train length ``L``
    (``d <= L``) and beyond it (``d > L``)."""
    rs = [r for (n, _), r in row.items() if n == eval_len]
    near = [r for r in rs if r["distance"] <= r["train_len"]]
    far = [r for r in rs if r["distance"] > r["train_len"]]
    return _mean(rs), _mean(near), _mean(far)


def _train_len(row) -> int:
    return int(next(iter(row.values()))["train_len"])


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ppl(records: Sequence[dict], scheme: str, method: str, n: int):
    for r in pool_records(records):
        if r.get("scheme") == scheme and int(r.get("eval_len") or 0) == n and r.get("status", "ok") == "ok" \
                and (is_identity(r.get("method")) if is_identity(method) else r.get("method") == method):
            return r.get("ppl")
    return None


def _is_mask(method: str) -> bool:
    """True when every method of ``method`` is a mask (a window that hides distant keys)."""
    try:
        ms = parse_methods(method, identity=False)
    except (UnknownMethodError, ValueError):
        return False
    return bool(ms) and all(m.kind == "mask" for m in ms)


def _verdict(ratio, far) -> str:
    """The verdict of :mod:`posenc.evals.stats.verdict` (perplexity kept and far needles retrieved), in words: a row
    whose perplexity grows past ``PPL_KEEP`` fails even when it still copies far needles (plain RoPE at 2.6x)."""
    v = classify(ratio, far)
    if v is None:
        return ""
    if v == EXTENDS:
        return "uses the long context"
    if v == LOCAL:
        return "local only: keeps perplexity, loses far needles"
    return f"fails: perplexity x{ratio:.2f}" + (", though far needles are still found" if far is not None
                                                  and far >= FAR_OK else "")


def ppl_vs_retrieval_table(records: Sequence[dict], retrieval: Sequence[dict]) -> str:
    """The headline Markdown table "perplexity vs retrieval" (module docstring); "" without recall data."""
    table = cells(retrieval)
    if not table:
        return ""
    out = [f"| scheme / method | PPL(L) | PPL({FAR_FACTOR}L) | ratio | recall@L | recall@{FAR_FACTOR}L | "
           f"near (d<=L) | far (d>L) | verdict |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (scheme, method), row in table.items():
        L = _train_len(row)
        a, b = _ppl(records, scheme, method, L), _ppl(records, scheme, method, FAR_FACTOR * L)
        ratio = b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 else None
        at_l, _, _ = far_near(row, L)
        at_far, near, far = far_near(row, FAR_FACTOR * L)
        ppl_s = [("-" if x is None else f"{x:.3g}") for x in (a, b)]
        out.append(f"| {_label(scheme, method)} | {ppl_s[0]} | {ppl_s[1]} | {_fmt(ratio)} | {_fmt(at_l)} | "
                   f"{_fmt(at_far)} | {_fmt(near)} | {_fmt(far)} | {_verdict(ratio, far)} |")
    chance = next(iter(next(iter(table.values())).values())).get("chance")
    out += ["", f"Recall: exact-match accuracy on the final query (chance {_fmt(chance)}); recall@nL is the mean "
            "over the probed needle distances at evaluation length nL, split into needles within the training "
            "length (near) and beyond it (far)."]
    return "\n".join(out)


def plot_retrieval(retrieval: Sequence[dict], path, task: str = "recall") -> Path | None:
    """One heatmap per scheme/method: needle distance (x) by evaluation length (y), colour = accuracy,
    chance marked in the colour bar. None (nothing written) without data."""
    import numpy as np

    table = cells(retrieval, task)
    if not table:
        return None
    ncols = min(4, len(table))
    nrows = math.ceil(len(table) / ncols)
    fig, axes = new_figure(3.4 * ncols, 2.5 * nrows + 0.6, nrows, ncols)
    im = None
    for ax, ((scheme, method), row) in zip(axes, table.items()):
        lengths = sorted({n for n, _ in row})
        dists = sorted({d for _, d in row})
        grid = np.full((len(lengths), len(dists)), np.nan)
        for (n, d), r in row.items():
            grid[lengths.index(n), dists.index(d)] = float(r["accuracy"])
        im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", origin="lower")
        L = _train_len(row)
        ax.set_xticks(range(len(dists)), [str(d) for d in dists], fontsize=6, rotation=45)
        ax.set_yticks(range(len(lengths)), [f"{n // L}L" if n % L == 0 else str(n) for n in lengths], fontsize=7)
        ax.set_title(_label(scheme, method), fontsize=8)
        ax.set_xlabel(f"needle distance (tokens; L = {L})", fontsize=7)
        ax.set_ylabel("eval length", fontsize=7)
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=5.5, color="white" if v < 0.5 else "black")
    for ax in axes[len(table):]:
        ax.set_axis_off()
    chance = next(iter(next(iter(table.values())).values())).get("chance")
    bar = fig.colorbar(im, ax=list(axes[:len(table)]), shrink=0.8, label=f"{task} accuracy")
    if isinstance(chance, (int, float)):
        bar.ax.axhline(chance, color="red", linewidth=1.5)
        bar.ax.text(1.6, chance, "chance", color="red", fontsize=6, va="center", transform=bar.ax.get_yaxis_transform())
    return save_png(fig, path, dpi=100, make_dirs=True)


def retrieval_checks(retrieval: Sequence[dict]) -> list[str]:
    """The probe's expected shapes on the RoPE model, one PASS/FAIL/SKIP line each:

    1. plain RoPE retrieves at L (mean accuracy >= 0.9);
    2. plain RoPE fails at 4L (mean < 0.5);
    3. every windowed (mask) method answers needles within L/2 (>= 0.8) and is near chance beyond L
       (<= chance + 0.1) at every evaluation length above L;
    4. the best training-free extension keeps mean accuracy >= 0.8 at 4L over all distances.
    """
    table = cells(retrieval)
    rope = table.get(("rope", "none"))
    if not rope:
        return ["SKIP: retrieval shapes: no recall records of the plain RoPE model"]
    L = _train_len(rope)
    lines = []
    at_l, at_far = far_near(rope, L)[0], far_near(rope, FAR_FACTOR * L)[0]
    for ok, text in ((at_l is not None and at_l >= RETRIEVES_AT_L,
                      f"plain RoPE retrieves at L: mean recall {_fmt(at_l)} (expected >= {RETRIEVES_AT_L})"),
                     (at_far is not None and at_far < FAILS_BELOW,
                      f"plain RoPE fails at {FAR_FACTOR}L: mean recall {_fmt(at_far)} (expected < {FAILS_BELOW})")):
        lines.append(f"{'PASS' if ok else 'FAIL'}: {text}")
    for (scheme, method), row in table.items():
        if scheme != "rope" or not _is_mask(method):
            continue
        chance = next(iter(row.values())).get("chance") or 0.0
        near = [r for (n, d), r in row.items() if n > L and d <= L // 2]
        far = [r for (n, d), r in row.items() if n > L and d > L]
        ok = bool(near and far) and _mean(near) >= NEAR_OK and _mean(far) <= chance + CHANCE_MARGIN
        lines.append(f"{'PASS' if ok else 'FAIL'}: {method} is right on near needles and near chance beyond its "
                     f"window: d <= L/2 {_fmt(_mean(near))} (expected >= {NEAR_OK}), d > L {_fmt(_mean(far))} "
                     f"(expected <= chance {chance:.2f} + {CHANCE_MARGIN})")
    ext = {m: far_near(row, FAR_FACTOR * L)[0] for (s, m), row in table.items()
           if s == "rope" and not is_identity(m) and not _is_mask(m)}
    ext = {m: v for m, v in ext.items() if v is not None}
    if ext:
        best, v = max(ext.items(), key=lambda kv: kv[1])
        lines.append(f"{'PASS' if v >= EXTENSION_OK else 'FAIL'}: the best training-free extension keeps recall at "
                     f"{FAR_FACTOR}L: {best} {v:.2f} (expected >= {EXTENSION_OK})")
    else:
        lines.append(f"SKIP: no training-free extension with recall at {FAR_FACTOR}L")
    return lines
