"""The GPU table: markdown rendered from a committed ``benchmarks/results/gpu-<card>.json`` (what
``benchmarks/gpu/run.py`` wrote on that card), for the README's GPU section and ``docs/results/gpu.md``.

    python3 -m benchmarks.gpu.report benchmarks/results/gpu-h100.json   # prints the block

Absolute times hold for that card only; the ratios, each against a peer timed in the same run on the same card,
are the result. The block names the card, the torch/transformers it ran with, and every goal beside its ratio.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _met(value: float, goal: str) -> str:
    op, bound = goal.split()
    ok = value <= float(bound) if op == "<=" else value >= float(bound)
    return "yes" if ok else "**no**"


def anchor_rows(anchors: dict) -> list[str]:
    """One table row per anchor: what, posenc's time, the peer's, the ratio, the goal, whether it is met."""
    rows = []
    rope = anchors.get("rope")
    if rope:
        frac = rope["fraction_of_copy"]
        rows.append(f"| RoPE application, {rope['shape']} | {rope['ms']['posenc']} ms | copy {rope['ms']['copy']} ms"
                    f" | {frac['posenc']} of copy bandwidth (transformers' eager: {frac['transformers_eager']}) | "
                    "(Liger: 0.93-1.00) | - |")
    a = anchors.get("alibi")
    if a:
        rows.append(f"| ALiBi ({a['ran']}), {a['shape']} | {a['ms']['posenc_alibi']} ms | bias-free causal SDPA "
                    f"{a['ms']['sdpa_causal_no_bias']} ms | {a['ratio']}x | {a['goal']} | "
                    f"{_met(a['ratio'], a['goal'])} |")
    for r in anchors.get("remaps", []):
        built = r["ms"].get("posenc_with_mask_build")
        rows.append(f"| {r['method']} ({r['ran']}), q {r['shape_q']} | {r['ms']['posenc']} ms"
                    + (f" ({built} with its block masks built)" if built is not None else "") + " | causal flash "
                    f"{r['ms']['flash_causal']} ms | {r['ratio']}x | {r['goal']} | {_met(r['ratio'], r['goal'])} |")
    w = anchors.get("sliding_window")
    if w:
        rows.append(f"| sliding window {w['window']} ({w['ran']}), q {w['shape_q']} | "
                    f"{w['ms']['posenc_window']} ms | full causal flash {w['ms']['flash_full_causal']} ms | "
                    f"{w['speedup']}x faster | {w['goal']} | {_met(w['speedup'], w['goal'])} |")
    t = anchors.get("training_step")
    if t:
        rows.append(f"| training step, {t['batch']} x {t['tokens']} tokens, dim {t['dim']} | {t['ms']['posenc']} ms | "
                    f"plain SDPA layer {t['ms']['plain_sdpa']} ms | {t['speed_vs_plain']}x the speed | {t['goal']} | "
                    f"{_met(t['speed_vs_plain'], t['goal'])} |")
    return rows


def model_rows(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        dec = r.get("decode_tok_s", "-")
        out.append(f"| {r['model']} | {r['method']} | {r['length']} | {r['prefill_s']} | "
                   f"{r.get('prefill_vs_untouched', '-') if r['method'] != 'none' else 1} | {dec} | "
                   f"{r.get('decode_vs_untouched', '-') if r['method'] != 'none' else (1 if dec != '-' else '-')} |")
    return out


def render(data: dict) -> str:
    """The markdown block of one run's JSON."""
    dev, ver, sec = data["device"], data["versions"], data["sections"]
    lines = [f"Card: **{dev.get('name')}** ({dev.get('memory_gib', '-')} GiB), torch {ver.get('torch')}, "
             f"transformers {ver.get('transformers')}, {data['dtype']}; the run took {data.get('wall_s')} s"
             f" ({len(data['errors'])} errors, {len(data['skipped'])} items skipped for time)."]
    c = sec.get("ceilings")
    if c:
        lines.append(f"Ceilings measured in the run: copy {c['copy_GBps']} GB/s (read + written), "
                     f"{c['matmul_TFLOPs']} TFLOP/s on a {c['matmul_shape'][0]}-cube matrix product.")
    corr = sec.get("correctness", {})
    eng, dec = corr.get("engine", []), corr.get("decode", [])
    if eng or dec:
        worst = {}
        for r in eng:
            worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), r["rel_err"])
        lines.append(f"Correctness: {sum(r['pass'] for r in eng)} of {len(eng)} engine paths within tolerance of the "
                     f"float64 reference (largest relative error: "
                     + ", ".join(f"{d} {e:.2g}" for d, e in sorted(worst.items()))
                     + f"); cached decode equals the full forward for {sum(r['pass'] for r in dec)} of {len(dec)} "
                     "(method, dtype) pairs.")
    rows = anchor_rows(sec.get("anchors", {}))
    if rows:
        lines += ["", "| anchor | posenc | peer, same run | ratio | goal | met |", "|---|---|---|---|---|---|", *rows]
    mrows = model_rows(sec.get("models", {}).get("rows", []))
    if mrows:
        lines += ["", "| model (random weights) | method | tokens | prefill s | x untouched | decode tok/s | "
                  "x untouched |", "|---|---|---|---|---|---|---|", *mrows]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python3 -m benchmarks.gpu.report benchmarks/results/gpu-<card>.json", file=sys.stderr)
        return 2
    print(render(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
