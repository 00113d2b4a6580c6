"""The suite report's answer-first pages, for runs judged by the interval rule (:mod:`posenc.evals.suite.verdict`).

The first screen holds the answer: the model, its trained length ``L``, the reference (the untouched model's keys
found at ``L``, with n and interval), the verdict of every method (extends to N / keeps perplexity only / neither
/ undecided) and one figure, accuracy against length with Wilson intervals, one line per method. Then: accuracy
by distance back (a figure, one panel per length, and a table), the paired perplexity ratios over passages, the
paired differences in keys found (Newcombe), saying which are separated from zero, and the cost. Rows left out
are one line. Colours: the lab's family colours (:func:`posenc.evals.report.families.palette`), one per row.

Cost: each cell records the machine's 1-minute load when it started and, newer cells, the machine's matmul speed
probed right before its prefill; a prefill time is compared only with those measured under a similar load
(:data:`LOAD_BAND`) and, at a length where cells were probed, on a machine as fast (:data:`SPEED_BAND`); the others
are shown as not compared. Peak memory is not reported: it was read in a long-lived process, where it depends on
what ran before.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import median

from posenc._figures import new_figure, save_png
from posenc.methods import is_identity

__all__ = ["LOAD_BAND", "SPEED_BAND", "colors", "cost_rows", "distance_rows", "first_screen", "identity_lines",
           "length_rows", "plot_accuracy", "plot_distance", "ppl_rows", "separated_rows", "summary_distance",
           "summary_verdicts", "verdict_rows"]

LOAD_BAND = 1.0
"""Two cells' prefill times are compared only when the machine's load at their starts differs by at most this."""

SPEED_BAND = 0.2
"""At a length where cells probed the machine's matmul speed, a row's prefill time is compared only when every one of
its cells was probed and all its probes lie within this fraction of the length's typical speed: the median, over the
fully probed rows there, of each row's fastest probe. A median, not the fastest probe, so that one fast cell does not
exclude every other row. Measured: the first five probed 128k Gemma 3 cells, one machine and sitting, probed 323-353
GFLOP/s (9% apart) and prefilled in 594-628 s."""


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _grid(results: dict) -> tuple[list[str], list[int], dict]:
    recs = results["records"]
    methods = list(dict.fromkeys(r["method"] for r in recs))
    return methods, sorted({r["eval_len"] for r in recs}), {(r["method"], r["eval_len"]): r for r in recs}


def _iv(iv: dict | None) -> str:
    if not iv or not iv.get("n"):
        return "-"
    return f"{iv['k']}/{iv['n']} = {iv['value']:.2f} [{iv['lo']:.2f}, {iv['hi']:.2f}]"


def _ratio(r: dict | None) -> str:
    if not r:
        return "-"
    ends = f" [{r['lo']:.2f}, {r['hi']:.2f}]" if r.get("lo") is not None else " (one passage: no interval)"
    return f"{r['value']:.2f}{ends} n={r['n']}"


def colors(results: dict) -> dict[str, tuple]:
    """One colour per row: the untouched model black, the others their family's shades (distinct)."""
    from posenc.evals.report.families import palette

    methods, _, _ = _grid(results)
    name = str(results["meta"].get("model_id", "model"))
    pal = palette([(name, m) for m in methods if not is_identity(m)])
    return {m: (0.0, 0.0, 0.0) if is_identity(m) else pal[(name, m)]["color"] for m in methods}


def first_screen(results: dict) -> list[str]:
    """The lines above the verdicts: model, L, reference with n and interval, the floor, the rule."""
    from posenc.evals.suite.verdict import rule_text

    meta, ref = results["meta"], results.get("reference", {})
    lengths = _grid(results)[1]
    lines = [f"Model: {meta.get('model')}, trained at L = {meta.get('train_len')} tokens; lengths "
             + ", ".join(_k(n) for n in lengths) + "."]
    iv = ref.get("interval") or {}
    lines.append(f"Reference: the untouched model at L finds {_iv(iv)} of the keys (Wilson 95%)"
                 + (f"; floor {ref['floor']:g}" if ref.get("floor") is not None else "") + ".")
    if ref.get("below_floor"):
        lines.append("The reference is below the floor (or not run yet): no method is judged and no effective "
                     "length is given.")
    lines.append(rule_text(ref.get("ppl_bound", 1.25)))
    left = meta.get("left_out") or {}
    if left:
        lines.append(f"Left out: {len(left)} rows (" + ", ".join(sorted(left)) + "); the reasons are in the run "
                     "details.")
    missing = meta.get("missing") or {}
    if missing:
        lines.append(f"Not finished: {sum(missing.values())} cells not run yet (" + ", ".join(sorted(missing))
                     + "); the rows hold the cells finished so far.")
    lines += identity_lines(meta)
    return lines


def identity_lines(meta: dict) -> list[str]:
    """The line naming the rows whose parameters are the identity at a length (``meta["same_as_untouched"]``)."""
    same = meta.get("same_as_untouched") or []
    if not same:
        return []
    return ["Identity at its length, so sharing the untouched model's cells there: " + ", ".join(
        f"{r.rpartition('@')[0]} at {_k(int(r.rpartition('@')[2]))}" for r in same) + " (its parameters read "
        "every pair as the untouched model does)."]


def verdict_text(v: dict) -> str:
    """A stored interval-rule verdict (:func:`posenc.evals.suite.verdict.judge`'s dict) as a page prints it: its
    lengths in k (``extends to 65536`` -> ``extends to 64k``)."""
    verdict = v["verdict"]
    if verdict.startswith("extends to "):
        return "extends to " + _k(int(verdict.rsplit(" ", 1)[1]))
    return verdict


def verdict_rows(results: dict) -> list[tuple[str, str, str]]:
    """``(method, verdict, effective length)`` per judged row, the untouched model first."""
    eff = results.get("effective", {})
    out = []
    for m, v in results.get("verdicts", {}).items():
        verdict = verdict_text(v)
        if v.get("undecided_at"):
            verdict += f" (undecided at {_k(v['undecided_at'])})"
        e = (eff.get(m) or {}).get("effective_length")
        out.append((m, verdict, _k(e) if e else "none"))
    return out


def separated_rows(results: dict) -> list[tuple[str, ...]]:
    """The paired differences in keys found: ``(length, method, versus, difference [interval], wins-losses of n,
    separated or not)``; separated when Newcombe's interval excludes 0."""
    out = []
    for c in results.get("comparisons") or []:
        if not c["n"]:
            continue
        sep = c["lo"] > 0 or c["hi"] < 0
        out.append((_k(c["length"]), c["method"], c["versus"], f"{c['value']:+.2f} [{c['lo']:+.2f}, {c['hi']:+.2f}]",
                    f"{c['wins']}-{c['losses']} of {c['n']}", "separated" if sep else "not separated"))
    return out


def length_rows(results: dict) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows: per method, at each length the keys found (k/n, value, Wilson 95%) and the perplexity of
    the target passages (geometric mean over them)."""
    methods, lengths, by = _grid(results)
    rows = []
    for m in methods:
        cells = []
        for n in lengths:
            r = by.get((m, n))
            ppl = "" if r is None or r.get("ppl") is None else f"; PPL {r['ppl']:.3g}"
            cells.append("-" if r is None else _iv(r["retrieval"]) + ppl)
        rows.append((m, *cells))
    return ("method", *[_k(n) for n in lengths]), rows


def distance_rows(results: dict) -> list[tuple[str, ...]]:
    """Keys found per distance bin: ``(method, length, bin edges, k/n [interval], wrong answers that gave another
    key's value of all wrong, mean distance)``."""
    methods, lengths, by = _grid(results)
    out = []
    for m in methods:
        for n in lengths:
            for b in (by.get((m, n)) or {}).get("by_bin") or []:
                iv = b["interval"]
                other = f"{b.get('other_key', 0)} of {iv['n'] - iv['k']}"
                out.append((m, _k(n), f"{b['from']}-{b['to']}", _iv(iv), other, str(b["distance"])))
    return out


def _kn(iv: dict | None) -> str:
    """Keys found as ``k/n [lo, hi]`` (Wilson 95%), the summary's short form."""
    if not iv or not iv.get("n"):
        return "-"
    return f"{iv['k']}/{iv['n']} [{iv['lo']:.2f}, {iv['hi']:.2f}]"


def summary_verdicts(results: dict) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows of a README's one-table answer: per method its verdict and effective length, the keys found
    at every length (``k/n [Wilson 95%]``) and, past the trained length, the perplexity ratio to the untouched model
    at L with its t 95% interval over the passages."""
    methods, lengths, by = _grid(results)
    past = [n for n in lengths if n > results["meta"]["train_len"]]
    judged = {m: (v, e) for m, v, e in verdict_rows(results)}
    rows = []
    for m in methods:
        verdict, eff = judged.get(m, ("-", "-"))
        ratios = []
        for n in past:
            r = (by.get((m, n)) or {}).get("ppl_ratio")
            ratios.append("-" if not r or r.get("value") is None else f"{r['value']:.2f}" + (
                f" [{r['lo']:.2f}, {r['hi']:.2f}]" if r.get("lo") is not None else ""))
        rows.append((m, verdict, eff, *[_kn((by.get((m, n)) or {}).get("retrieval")) for n in lengths], *ratios))
    header = ("method", "verdict", "effective length", *[f"keys at {_k(n)}" for n in lengths],
              *[f"PPL ratio at {_k(n)}" for n in past])
    return header, rows


def summary_distance(results: dict, factors=(1, 2, 4)) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows of a README's distance table: per method the keys found in each distance bin
    (``k/n [Wilson 95%]``) at ``f x L`` for each factor run (the trained length L first, as the control)."""
    methods, lengths, by = _grid(results)
    train = results["meta"]["train_len"]
    shown = [n for n in lengths if n in {f * train for f in factors}]
    bins = {(m, n, b["from"], b["to"]): b["interval"] for m in methods for n in shown
            for b in (by.get((m, n)) or {}).get("by_bin") or []}
    cols = sorted({key[1:] for key in bins})
    rows = [(m, *[_kn(bins.get((m, *c))) for c in cols]) for m in methods]
    return ("method", *[f"{_k(n)}: {lo}-{hi} back" for n, lo, hi in cols]), rows


def ppl_rows(results: dict) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Header and rows of the paired perplexity ratios: per (method, length) the ratio to the untouched model at L
    and to each comparison row at the same length (geometric mean over passages, t 95% interval)."""
    methods, lengths, by = _grid(results)
    versus = list(dict.fromkeys(v for r in results["records"] for v in (r.get("ppl_vs") or {})))
    header = ("method", "length", "PPL", "/ untouched at L", *[f"/ {v}" for v in versus])
    rows = []
    for m in methods:
        for n in lengths:
            r = by.get((m, n))
            if r is None or r.get("ppl") is None:
                continue
            rows.append((m, _k(n), f"{r['ppl']:.3g}", _ratio(r.get("ppl_ratio")),
                         *[_ratio((r.get("ppl_vs") or {}).get(v)) for v in versus]))
    return header, rows


def cost_rows(results: dict) -> list[tuple[str, ...]]:
    """Per (method, length): mean prefill seconds, the mean load at the cells' starts, the matmul GFLOP/s probed
    there (lowest-highest) and the cells; a time is shown only when its load is within :data:`LOAD_BAND` of the
    lowest load at that length and, where that length's cells were probed, its machine within :data:`SPEED_BAND` of
    the length's typical speed (else "not compared", saying why)."""
    methods, lengths, by = _grid(results)
    out = []
    for n in lengths:
        rows = {m: by[(m, n)] for m in methods if (m, n) in by}
        loads = [r["loadavg"] for r in rows.values() if r.get("loadavg") is not None]
        low = min(loads) if loads else None
        probed = [r["gflops"]["hi"] for r in rows.values() if _probed(r)]
        typical = median(probed) if probed else None
        any_probe = any(r.get("gflops") for r in rows.values())
        for m, r in rows.items():
            load, speed = r.get("loadavg"), r.get("gflops")
            if load is None or low is None:
                time = "not compared (load not recorded)"
            elif load - low > LOAD_BAND:
                time = f"not compared (load {load:.1f} vs {low:.1f})"
            elif any_probe and not _probed(r):
                time = "not compared (machine speed not probed for every cell)"
            elif any_probe and not _in_band(speed, typical):
                time = f"not compared (matmul {_speed(speed)} vs typical {typical:.0f} GFLOP/s)"
            else:
                time = f"{r['prefill_s']:.0f} s"
            out.append((m, _k(n), time, "not recorded" if load is None else f"{load:.1f}",
                        _speed(speed) if speed else "not probed", str(r.get("cells", ""))))
    return out


def _in_band(speed: dict, typical: float) -> bool:
    """Whether every probe of a row (``lo``-``hi`` GFLOP/s) lies within :data:`SPEED_BAND` of ``typical``."""
    return typical / (1 + SPEED_BAND) <= speed["lo"] and speed["hi"] <= typical * (1 + SPEED_BAND)


def _probed(r: dict) -> bool:
    """Whether every cell of the row ``r`` probed the machine's speed."""
    return bool(r.get("gflops")) and r["gflops"]["cells"] == r.get("cells")


def _speed(s: dict) -> str:
    lo, hi = round(s["lo"]), round(s["hi"])
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def plot_accuracy(results: dict, path: Path) -> Path:
    """Keys found against length, Wilson 95% intervals as error bars, one line per method; the reference's
    interval as a grey band, L dashed."""
    methods, lengths, by = _grid(results)
    col = colors(results)
    fig, (ax,) = new_figure(7.5, 3.6)
    for i, m in enumerate(methods):
        pts = [(n, by[(m, n)]["retrieval"]) for n in lengths if (m, n) in by and by[(m, n)]["retrieval"].get("n")]
        if not pts:
            continue
        shift = 2 ** ((i - (len(methods) - 1) / 2) * 0.03)  # a little apart, so the bars do not hide each other
        xs = [n * shift for n, _ in pts]
        ys = [iv["value"] for _, iv in pts]
        err = [[iv["value"] - iv["lo"] for _, iv in pts], [iv["hi"] - iv["value"] for _, iv in pts]]
        ax.errorbar(xs, ys, yerr=err, marker="o", color=col[m], label=m, lw=2 if is_identity(m) else 1.3, capsize=3)
    iv = (results.get("reference") or {}).get("interval") or {}
    if iv.get("n"):
        ax.axhspan(iv["lo"], iv["hi"], color="grey", alpha=0.15, lw=0, label="reference (untouched at L)")
    train = results["meta"].get("train_len")
    if train:
        ax.axvline(train, color="grey", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [_k(n) for n in lengths])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("context length (dashed: trained length L)")
    ax.set_ylabel("keys found")
    ax.set_title("keys found against length (Wilson 95% intervals)", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower left")
    return save_png(fig, path, 100)


def plot_distance(results: dict, path: Path) -> Path | None:
    """Keys found against distance back, one panel per length, one line per method (Wilson intervals); None (and
    no file) when no row has distance bins."""
    fig = distance_figure(results)
    return None if fig is None else save_png(fig, path, 100)


def distance_figure(results: dict):
    """The figure of :func:`plot_distance`, its legend (beside the panels) naming every row drawn in any panel: a
    row left out at the longest length is still named."""
    methods, lengths, by = _grid(results)
    at = [n for n in lengths if any((by.get((m, n)) or {}).get("by_bin") for m in methods)]
    if not at:
        return None
    col = colors(results)
    fig, axes = new_figure(3.4 * len(at) + 1.8, 3.2, 1, len(at))
    handles = {}
    for ax, n in zip(axes, at):
        for m in methods:
            bins = (by.get((m, n)) or {}).get("by_bin") or []
            if not bins:
                continue
            xs = [b["distance"] for b in bins]
            ys = [b["interval"]["value"] for b in bins]
            err = [[b["interval"]["value"] - b["interval"]["lo"] for b in bins],
                   [b["interval"]["hi"] - b["interval"]["value"] for b in bins]]
            handles.setdefault(m, ax.errorbar(xs, ys, yerr=err, marker="o", color=col[m], label=m, capsize=2,
                                              lw=1.2))
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"at {_k(n)}", fontsize=9)
        ax.set_xlabel("tokens back (bin mean)")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_formatter(_tokens_formatter())
    axes[0].set_ylabel("keys found")
    fig.legend(list(handles.values()), list(handles), loc="outside right center", fontsize=7)
    return fig


def _tokens_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _: f"{x / 1024:g}k" if x >= 1024 else f"{x:g}" if math.isfinite(x) else "")
