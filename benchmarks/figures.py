"""Figures of the committed timing and coverage results that have none of their own (the bench reports and the suite
draw theirs): one PNG beside each JSON under ``benchmarks/results/``, shown by its results page.

- ``bench_attention.png``: the attention engine's paths against SDPA, milliseconds per call by sequence length
  (``bench_attention.json``, docs/results/performance.md);
- ``bench_real_model.png``: every method through ``posenc.hf.extend`` on SmolLM2, prefill and decode time against
  the untouched model, per length (``bench_real_model.json``, docs/results/real-model-speed.md);
- ``bench_gemma3_speed.png``: Gemma 3 270M's prefill on transformers' path and on posenc's identity path (the local
  layers windowed), seconds and memory per length (``bench_gemma3_speed.json``, docs/results/gemma3.md);
- ``hf_compat.png``: the transformers RoPE families by outcome, and how far posenc's engine running plain RoPE is from
  each family's own model, in logits (``hf_compat.json``, docs/results/hf-compat.md).

``python -m benchmarks.figures`` draws them again from the JSON (``--check``: compare, exit 1 naming a stale one);
``tests/benchmarks/test_figures.py`` checks that the committed ones are current.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DPI = 90


def _load(name: str, results: Path) -> dict:
    return json.loads((results / name).read_text())


def attention(results: Path, out: Path) -> Path:
    """Milliseconds per call against sequence length, one line per path (log-log); SDPA's causal kernel in black."""
    from posenc._figures import new_figure, save_png

    data = _load("bench_attention.json", results)
    by_n = {int(k.split("=")[1]): v["ms"] for k, v in data["summary"].items()
            if k.startswith("N=") and isinstance(v, dict) and "ms" in v}
    cases = sorted({c for ms in by_n.values() for c in ms}, key=lambda c: (c != "sdpa_causal", c))
    from matplotlib import colormaps

    fig, (ax,) = new_figure(8.0, 5.0)
    palette = colormaps["tab20"].colors
    for i, case in enumerate(cases):
        pts = sorted((n, ms[case]) for n, ms in by_n.items() if case in ms)
        style = ({"color": "black", "lw": 2.5} if case == "sdpa_causal"
                 else {"marker": "os^D"[i % 4], "ms": 4, "color": palette[(2 * i) % 20 if i < 10 else 2 * i % 20 + 1]})
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=case, **style)
    cfg = data["config"]
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(by_n), [f"{n // 1024}k" for n in sorted(by_n)])
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N (tokens)")
    ax.set_ylabel("milliseconds per attention call (median)")
    ax.set_title(f"Attention paths against SDPA (B={cfg['B']}, H={cfg['H']}, D={cfg['D']}, causal; "
                 f"{data['machine']['cores']} CPU cores)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", ncol=2)
    return save_png(fig, out / "bench_attention.png", DPI)


def real_model(results: Path, out: Path) -> Path:
    """Prefill and decode time of every method over the untouched model's (median over the repeats), per length."""
    from posenc._figures import new_figure, save_png

    data = _load("bench_real_model.json", results)
    ratios: dict[tuple[str, str, int], float] = {}
    for key, value in data["summary"].items():
        n, method, what = key.split(".", 2)
        ratios[(what, method, int(n))] = value
    methods = sorted({m for _, m, _ in ratios})
    lengths = sorted({n for _, _, n in ratios})
    fig, axes = new_figure(13.0, 0.32 * len(methods) + 1.6, 1, 2)
    for ax, what, title in zip(axes, ("prefill_ratio", "decode_ratio"),
                               ("prefill time / untouched (below 1: faster)",
                                "decode tokens/s / untouched (above 1: faster)")):
        for j, n in enumerate(lengths):
            ys = [i + (j - (len(lengths) - 1) / 2) * 0.18 for i in range(len(methods))]
            xs = [ratios.get((what, m, n), math.nan) for m in methods]
            ax.plot(xs, ys, "o", ms=4, label=f"{n // 1024}k" if n % 1024 == 0 else str(n))
        ax.axvline(1.0, color="black", lw=1)
        ax.set_yticks(range(len(methods)), methods)
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
        ax.set_title(title)
        ax.set_xlabel("ratio to the untouched model (1: the same)")
        ax.legend(title="length", fontsize="small")
    layers = data["layers_timed"]
    fig.suptitle(f"{data['model']} through posenc.hf.extend, {layers} decoder layer{'s' if layers != 1 else ''} "
                 f"timed, median over the repeats")
    return save_png(fig, out / "bench_real_model.png", DPI)


def compat(results: Path, out: Path) -> Path:
    """Families by outcome, and per passing family the largest logit difference between the untouched model and
    posenc's engine running plain RoPE (``posenc.hf.compat.rope_difference``, log)."""
    from posenc._figures import new_figure, save_png

    data = _load("hf_compat.json", results)
    rows = data["rows"]
    statuses = sorted({r["status"] for r in rows}, key=lambda s: (s != "pass", s))
    fig, (left, right) = new_figure(12.0, 4.2, 1, 2)
    counts = [sum(r["status"] == s for r in rows) for s in statuses]
    bars = left.barh(statuses, counts, color=["tab:green" if s == "pass" else "tab:orange" for s in statuses])
    left.bar_label(bars, padding=3)
    left.set_xlim(0, max(counts) * 1.1)
    left.invert_yaxis()
    left.set_xlabel("transformers model families")
    left.set_title(f"RoPE causal-LM families of transformers {data['versions']['transformers']}")
    diffs = sorted(r["rope_max_diff"] for r in rows if r["status"] == "pass" and r.get("rope_max_diff") is not None)
    right.plot(range(len(diffs)), diffs, "o", ms=3)
    right.set_yscale("log")
    right.set_xlabel("passing families, sorted")
    right.set_ylabel("largest |logit difference|")
    right.set_title("posenc's engine (plain RoPE) vs the family's own model")
    right.grid(alpha=0.3, which="both")
    return save_png(fig, out / "hf_compat.png", DPI)


def gemma3_speed(results: Path, out: Path) -> Path:
    """Gemma 3 270M's prefill per length, transformers' path against posenc's identity path (best of the repeats),
    seconds and extra memory."""
    from posenc._figures import new_figure, save_png

    data = _load("bench_gemma3_speed.json", results)
    lengths = sorted(data["summary"], key=int)
    fig, (left, right) = new_figure(11.0, 3.6, 1, 2)
    width = 0.38
    for ax, key, label in ((left, "_s", "prefill seconds (best of the repeats)"),
                           (right, "_extra_mb", "extra resident memory of the prefill (MB)")):
        for j, (path, color) in enumerate((("transformers", "tab:gray"), ("posenc", "tab:blue"))):
            xs = [i + (j - 0.5) * width for i in range(len(lengths))]
            bars = ax.bar(xs, [data["summary"][n][path + key] for n in lengths], width, color=color,
                          label="transformers (local layers: masked full attention)" if path == "transformers"
                          else "posenc identity path (local layers windowed)")
            ax.bar_label(bars, fmt="%.0f", padding=2, fontsize="small")
        ax.set_ylim(0, 1.18 * max(data["summary"][n][p + key] for n in lengths for p in ("transformers", "posenc")))
        ax.set_xticks(range(len(lengths)), [f"{int(n) // 1024}k" for n in lengths])
        ax.set_xlabel("prefill length (tokens)")
        ax.set_title(label)
        ax.grid(alpha=0.3, axis="y")
    left.legend(fontsize="small", loc="upper left")
    fig.suptitle(f"{data['model']}: speedup " + ", ".join(
        f"{data['summary'][n]['speedup']:.1f}x at {int(n) // 1024}k" for n in lengths))
    return save_png(fig, out / "bench_gemma3_speed.png", DPI)


def near_key_attention(results: Path, out: Path) -> Path:
    """The near-key diagnostic: keys found by distance back per row (Wilson 95%), and per question where the
    retrieval heads' weight goes: on the answer's tokens against on the first tokens (filled: found, hollow: lost)."""
    from posenc._figures import new_figure, save_png

    data = _load("near_key_attention.json", results)
    rows = list(data["summary"]["rows"])
    heads = [tuple(h) for h in data["summary"]["retrieval_heads"]]
    colors = dict(zip(rows, ("black", "tab:gray", "tab:red", "tab:orange", "tab:green", "tab:blue", "tab:purple",
                             "tab:brown", "tab:pink", "tab:olive")))
    fig, (left, right) = new_figure(12.0, 4.8, 1, 2)
    for j, row in enumerate(rows):
        bins = data["summary"]["rows"][row]["bins"]
        xs = [(b["lo"] * b["hi"]) ** 0.5 * (1 + 0.04 * (j - len(rows) / 2)) for b in bins]
        ys = [b["value"] for b in bins]
        err = [[y - b["lo95"] for y, b in zip(ys, bins)], [b["hi95"] - y for y, b in zip(ys, bins)]]
        left.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=colors[row], label=row)
    left.set_xscale("log")
    left.set_xlabel("tokens from the key to the question")
    left.set_ylabel("keys found (Wilson 95%)")
    left.set_ylim(-0.05, 1.05)
    left.grid(alpha=0.3)
    left.legend(fontsize="x-small", ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    for q in data["questions"]:
        ans = sum(q["mass"]["answer"][layer][h] for layer, h in heads) / len(heads)
        start = sum(q["mass"]["start"][layer][h] for layer, h in heads) / len(heads)
        right.scatter(start, ans, s=28, color=colors[q["row"]], facecolors=colors[q["row"]] if q["correct"] else "none")
    right.set_xlabel("weight on the first 4 tokens (attention sink)")
    right.set_ylabel("weight on the key's digits")
    right.set_title("retrieval heads " + ", ".join(f"L{layer}H{h}" for layer, h in heads) + " (mean)",
                    fontsize="medium")
    right.grid(alpha=0.3)
    fig.suptitle(f"{data['model']}: where the answer's first token looks (filled: key found, hollow: lost)")
    return save_png(fig, out / "near_key_attention.png", DPI)


FIGURES = {"bench_attention.png": attention, "bench_real_model.png": real_model, "hf_compat.png": compat,
           "bench_gemma3_speed.png": gemma3_speed, "near_key_attention.png": near_key_attention}


def draw(results: Path | None = None, out: Path | None = None) -> list[Path]:
    """Draw every figure from the JSON in ``results`` (default: :data:`RESULTS`) into ``out`` (default: beside the
    JSON)."""
    results = RESULTS if results is None else results
    return [fn(results, out or results) for fn in FIGURES.values()]


def stale(results: Path | None = None) -> list[str]:
    """The committed figures that differ from what the committed JSON draws now (or are missing)."""
    results = RESULTS if results is None else results
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p.read_bytes() for p in draw(results, Path(tmp))}
    return [n for n, data in fresh.items() if not (results / n).is_file() or (results / n).read_bytes() != data]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.figures", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare the committed figures instead of drawing them")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        for name in bad:
            print(f"stale: benchmarks/results/{name}", file=sys.stderr)
        return 1 if bad else 0
    for path in draw():
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
