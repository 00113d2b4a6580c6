"""Where a decode step's time goes on the whole model: the untouched model's attention against posenc's engine.

    .venv/bin/python -m benchmarks.profile_decode [--tokens 8192] [--steps 16] [--repeats 3]
        [--methods selfextend,dca,...] [--name profile_decode]
    .venv/bin/python -m benchmarks.profile_decode --table benchmarks/results/profile_decode.json

SmolLM2-135M-Instruct, all 30 layers, float32 on the CPU, a synthetic cache of ``--tokens`` keys and values
(:func:`benchmarks.bench_real_model.synthetic_cache`) and one untimed step, as ``bench_real_model --decode-only``
does. Two measurements per row:

1. **Unprofiled**: ``--steps`` greedy steps, timed, interleaved with the untouched model (``--repeats`` rounds,
   the order rotated each round): milliseconds per step, and the engine's extra time per layer and step,
   ``(row - untouched) / layers``.
2. **Profiled** (``cProfile``, one pass of ``--steps`` steps): the attention function's time per layer and step,
   split into the fused kernel calls (PyTorch's SDPA / CPU flash op), the rotations (``rotate_queries`` and
   ``rotate_keys``, the key store included), the rest of the engine (choosing the backend, the call record,
   positions, merging pieces: Python and small tensor ops), and for the untouched model transformers' own
   rotation (``apply_rotary_pos_emb``). A profiler inflates Python more than kernels, so the split says where
   the time goes, and the unprofiled extra says how much it is.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time

import torch

from benchmarks.common import RESULTS, machine_info, write_json

ROWS = ("yarn@engine", "rerope", "selfextend", "dca", "string", "streaming_llm", "dynamic_ntk@step512")
#: (bucket, how it is read from the profile): kernels by their built-in's own time, the rest by cumulative time
KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_attention")
ROTATION = (("posenc/engine/rotation.py", "rotate_queries"), ("posenc/engine/rotation.py", "rotate_keys"))
ATTENTION = (("posenc/hf/attention.py", "posenc_attention"),
             ("integrations/sdpa_attention.py", "sdpa_attention_forward"))
HF_ROPE = (("modeling_llama.py", "apply_rotary_pos_emb"),)


def _sum(stats: pstats.Stats, names, cumulative: bool = True) -> float:
    """Seconds of the functions ``(file suffix, name)`` in ``names`` (cumulative, or own time)."""
    total = 0.0
    for (file, _line, func), (_cc, _nc, tt, ct, _callers) in stats.stats.items():
        if any(file.endswith(f) and func == n for f, n in names):
            total += ct if cumulative else tt
    return total


def _kernels(stats: pstats.Stats) -> tuple[float, int]:
    """Own seconds and calls of the fused attention kernels (built-ins)."""
    sec = calls = 0
    for (file, _line, func), (_cc, nc, tt, _ct, _callers) in stats.stats.items():
        if file == "~" and any(k in func for k in KERNELS):
            sec += tt
            calls += nc
    return sec, calls


def split(stats: pstats.Stats, layer_calls: int) -> dict:
    """Milliseconds per layer and step of the profile's buckets (module docstring)."""
    attention = _sum(stats, ATTENTION)
    kernel, kernel_calls = _kernels(stats)
    rotation = _sum(stats, ROTATION)
    hf_rope = _sum(stats, HF_ROPE)
    per = 1e3 / layer_calls
    return {"attention_ms": attention * per, "kernel_ms": kernel * per,
            "kernel_calls_per_layer": kernel_calls / layer_calls,
            "rotation_ms": rotation * per, "engine_rest_ms": max(0.0, attention - kernel - rotation) * per,
            "hf_rope_ms": hf_rope * per}


def _steps(model, n: int, steps: int, profile: bool = False):
    """Seconds per step of ``steps`` greedy steps after a synthetic ``n``-token cache and one untimed step (and the
    profile of the timed steps when ``profile``)."""
    from benchmarks.bench_real_model import synthetic_cache

    cache = synthetic_cache(model, n)
    tok = torch.zeros(1, 1, dtype=torch.long)
    prof = cProfile.Profile() if profile else None
    with torch.no_grad():
        model(input_ids=tok, past_key_values=cache, use_cache=True)
        if prof is not None:
            prof.enable()
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        sec = (time.perf_counter() - t0) / steps
        if prof is not None:
            prof.disable()
    return sec, (pstats.Stats(prof) if prof is not None else None)


def _with(model, row, n: int, fn):
    """``fn()`` with the row's method (its parameters for ``n`` tokens) applied to ``model`` (None: untouched),
    undone after."""
    from benchmarks.bench_real_model import BASE, HEAD_DIM, TRAIN_LEN
    from posenc.hf import extend, unextend
    from posenc.methods import length_defaults

    if row is None:
        return fn()
    _label, method, fixed, kw = row
    extend(model, method, **kw, **{**length_defaults(method, TRAIN_LEN, n, head_dim=HEAD_DIM, base=BASE), **fixed})
    try:
        return fn()
    finally:
        unextend(model)


def run(n: int = 8192, steps: int = 16, repeats: int = 3, methods=ROWS, log=print) -> dict:
    from benchmarks.bench_real_model import METHODS, load_model

    torch.manual_seed(0)
    rows = [r for r in METHODS if r[0] in methods]
    unknown = sorted(set(methods) - {r[0] for r in rows})
    if unknown:
        raise ValueError(f"--methods: no row {unknown} in benchmarks.bench_real_model.METHODS")
    model = load_model(None)
    layers = len(model.model.layers)
    out = {"model": "SmolLM2-135M-Instruct (float32, CPU, all layers)", "tokens": n, "steps": steps,
           "layers": layers, "repeats": repeats, "machine": machine_info(), "loadavg_start": list(os.getloadavg()),
           "untouched": {"ms_per_step": []}, "rows": {r[0]: {"ms_per_step": []} for r in rows}}
    t0 = time.perf_counter()

    def timed(profile=False):
        return _steps(model, n, steps, profile)

    _with(model, None, n, timed)  # unrecorded warm-up
    everyone = [None, *rows]
    for rep in range(repeats):
        order = everyone[rep % len(everyone):] + everyone[:rep % len(everyone)]
        for row in order:
            sec, _ = _with(model, row, n, timed)
            (out["untouched"] if row is None else out["rows"][row[0]])["ms_per_step"].append(sec * 1e3)
            log(f"  rep {rep} {'untouched' if row is None else row[0]}: {sec * 1e3:.1f} ms/step")
    base = statistics.median(out["untouched"]["ms_per_step"])
    for row in everyone:
        _, stats = _with(model, row, n, lambda: timed(True))
        entry = out["untouched"] if row is None else out["rows"][row[0]]
        entry["profile"] = split(stats, layers * steps)
        if row is not None:
            med = statistics.median(entry["ms_per_step"])
            entry["ratio"] = base / med  # decode speed over the untouched model's (tokens/s ratio)
            entry["extra_ms_per_layer"] = (med - base) / layers
    out["wall_s"] = time.perf_counter() - t0
    out["loadavg_end"] = list(os.getloadavg())
    return out


def table(res: dict) -> str:
    """The result as a markdown table: per row the unprofiled ms per step, its speed over the untouched model's,
    the extra ms per layer, and the profile's split of the attention per layer and step."""
    head = ("| row | ms per step (each repeat) | speed / untouched | extra ms per layer | profiled: attention "
            "per layer (ms) | kernel calls per layer | kernels | rotations | rest of the engine |")
    lines = [head, "|---" * 9 + "|"]

    def line(label, e):
        p = e["profile"]
        ms = ", ".join(f"{x:.1f}" for x in e["ms_per_step"])
        ratio = f"{e['ratio']:.2f}" if "ratio" in e else "1"
        extra = f"{e['extra_ms_per_layer']:.2f}" if "extra_ms_per_layer" in e else "-"
        rot = p["rotation_ms"] if label != "untouched" else p["hf_rope_ms"]
        rest = p["engine_rest_ms"] if label != "untouched" else max(0.0, p["attention_ms"] - p["kernel_ms"])
        return (f"| {label} | {ms} | {ratio} | {extra} | {p['attention_ms']:.2f} | {p['kernel_calls_per_layer']:.0f} | "
                f"{p['kernel_ms']:.2f} | {rot:.2f} | {rest:.2f} |")
    lines.append(line("untouched", res["untouched"]))
    lines += [line(label, e) for label, e in res["rows"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.profile_decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=8192, help="cache length (default 8192)")
    p.add_argument("--steps", type=int, default=16, help="timed decode steps per measurement (default 16)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved unprofiled rounds (default 3)")
    p.add_argument("--methods", default=",".join(ROWS), help="comma-separated row labels of bench_real_model")
    p.add_argument("--table", metavar="JSON", help="print the table of a finished run and exit")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="profile_decode", help="JSON file name (without .json) under --out")
    a = p.parse_args(argv)
    if a.table:
        print(table(json.loads(open(a.table, encoding="utf-8").read())))
        return 0
    res = run(a.tokens, a.steps, a.repeats, tuple(a.methods.split(",")))
    print(table(res))
    print(f"wrote {write_json(a.name, res, a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
