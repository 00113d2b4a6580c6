"""Gemma 3 270M's prefill, transformers' own path against posenc's identity path, at 16k and 32k.

    .venv/bin/python -m benchmarks.bench_gemma3_speed [--lengths 16384,32768] [--repeats 2,1] [--out DIR]

Gemma 3 interleaves five local layers (sliding window 512) with one global layer. transformers (SDPA, float32)
runs a local layer as full attention under a sliding mask, so its cost grows with ``n^2`` like the global
layers'; posenc's identity path (``posenc.hf.extend(model, "none", native=False)``: the untouched model, every
layer on posenc's engine) runs it on the engine's windowed kernel, which reads only the window's keys. Both
models are loaded once in this process (float32, CPU); per length and repeat the two prefills of the same
random tokens (``logits_to_keep=1``, no cache) alternate, the order flipped every repeat. Each prefill's
extra resident memory is its high-water mark over the resident size before it
(:func:`benchmarks.common.measure_peak`). The 1-minute load average is recorded beside every prefill: time only on
an idle machine.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from benchmarks.common import RESULTS, measure_peak, write_json

PATHS = ("transformers", "posenc")


def load(path: str):
    """Gemma 3 270M, float32, untouched (``transformers``: SDPA) or on posenc's identity path (``posenc``)."""
    from posenc.hf import extend
    from posenc.hf.source import load_source

    model, _ = load_source("gemma3-270m")
    model.set_attn_implementation("sdpa")
    return extend(model, "none", native=False) if path == "posenc" else model


def prefill(model, ids) -> dict:
    with torch.no_grad():
        return measure_peak(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1).logits)


def run(lengths=(16384, 32768), repeats=(2, 1), log=print) -> dict:
    models = {p: load(p) for p in PATHS}
    vocab = models["posenc"].config.vocab_size
    warm = torch.randint(0, vocab, (1, 1024), generator=torch.Generator().manual_seed(1))
    for m in models.values():  # one-time allocations, unrecorded
        prefill(m, warm)
    cells = []
    t_start = time.time()
    for length, reps in zip(lengths, repeats):
        ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
        for rep in range(reps):
            for path in PATHS if rep % 2 == 0 else PATHS[::-1]:
                r = prefill(models[path], ids)
                cells.append({"length": length, "repeat": rep, "path": path, "prefill_s": r["seconds"],
                              "extra_mb": r["extra_mb"], "load_after": os.getloadavg()[0]})
                log(f"  {length} rep {rep} {path}: {r['seconds']:.1f} s, +{r['extra_mb']:.0f} MB "
                    f"(load {cells[-1]['load_after']:.2f})")
    summary = {}
    for length in lengths:
        best = {p: min(c["prefill_s"] for c in cells if c["length"] == length and c["path"] == p) for p in PATHS}
        mem = {p: max(c["extra_mb"] for c in cells if c["length"] == length and c["path"] == p) for p in PATHS}
        summary[str(length)] = {"transformers_s": best["transformers"], "posenc_s": best["posenc"],
                                "speedup": best["transformers"] / best["posenc"],
                                "transformers_extra_mb": mem["transformers"], "posenc_extra_mb": mem["posenc"]}
    return {"model": "Gemma 3 270M (gemma3-270m: GGUF Q4_K_M de-quantized to float32), untouched, CPU",
            "paths": {"transformers": "transformers 'sdpa' (local layers: full attention under a sliding mask)",
                      "posenc": "posenc.hf.extend(model, 'none', native=False): every layer on posenc's engine"},
            "torch_threads": torch.get_num_threads(), "wall_s": time.time() - t_start, "cells": cells,
            "summary": summary}


def table(res: dict) -> str:
    """The Markdown table of one result: per length, seconds per path, the speedup and the extra memory."""
    rows = ["| length | transformers (s) | posenc identity path (s) | speedup | extra memory transformers / posenc "
            "(MB) |", "|---:|---:|---:|---:|---:|"]
    for length, s in res["summary"].items():
        rows.append(f"| {int(length) // 1024}k | {s['transformers_s']:.1f} | {s['posenc_s']:.1f} | "
                    f"{s['speedup']:.2f}x | {s['transformers_extra_mb']:.0f} / {s['posenc_extra_mb']:.0f} |")
    return "\n".join(rows)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise SystemExit(f"{flag} takes positive integers, got {text!r}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.bench_gemma3_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="16384,32768", help="comma-separated prefill lengths")
    p.add_argument("--repeats", default="2,1", help="repeats per length, comma-separated, one per length")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--table", metavar="JSON", default=None, help="print the Markdown table of a result file and exit")
    a = p.parse_args(argv)
    if a.table:
        import json
        from pathlib import Path

        print(table(json.loads(Path(a.table).read_text(encoding="utf-8"))))
        return 0
    lengths, repeats = _ints(a.lengths, "--lengths"), _ints(a.repeats, "--repeats")
    if len(repeats) != len(lengths):
        raise SystemExit(f"--repeats needs one count per length ({len(lengths)}), got {a.repeats!r}")
    res = run(lengths, repeats)
    print(table(res))
    print(f"wrote {write_json('bench_gemma3_speed', res, a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
